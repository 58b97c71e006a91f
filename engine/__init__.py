"""radixserve.engine: one serving replica (scheduler, radix cache, model execution).

`Engine` is resolved lazily so that torch-free parts (configs, CLI flags) can be imported
without loading torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Engine", "EngineCore"]


def __getattr__(name: str) -> Any:
    if name in ("Engine", "EngineCore"):
        from radixserve.engine.entrypoints.engine_core import EngineCore

        return EngineCore  # the in-process engine; the multi-process Engine shares its API
    raise AttributeError(name)
