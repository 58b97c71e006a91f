"""ForwardBatch (tensors for one forward) and ModelRunner (weights, KV pools, forward)."""
