"""radixserve.engine: one serving replica (scheduler, radix cache, model execution)."""

from radixserve.engine.entrypoints.engine import Engine

__all__ = ["Engine"]
