"""Process owners and the scheduler's CPU-side data: Req, ScheduleBatch, Scheduler."""
