"""Triton kernels, each with a plain-PyTorch reference (imports nothing from the engine)."""
