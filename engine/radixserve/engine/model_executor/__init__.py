"""ModelRunner (weights, KV pools, forward) and its CUDA-graph runner; the ForwardBatch they
run lives below the model, in `radixserve.engine.forward_batch`."""
