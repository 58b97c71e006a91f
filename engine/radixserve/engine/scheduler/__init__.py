"""The scheduler process: Req, ScheduleBatch, the batching policy and the Scheduler loop
that drives the model."""
