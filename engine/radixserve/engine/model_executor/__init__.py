"""ForwardBatch (tensors for one forward) and ModelRunner (weights, pools, forward, sample)."""
