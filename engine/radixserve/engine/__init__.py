"""radixserve.engine: one serving replica (scheduler, radix cache, model execution).

`Engine` is resolved lazily so that torch-free parts (configs, CLI flags) can be imported
without loading torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Engine", "EngineCore"]


def __getattr__(name: str) -> Any:
    if name == "Engine":  # multi-process, like sglang.Engine
        from radixserve.engine.entrypoints.engine import Engine

        return Engine
    if name == "EngineCore":  # model + scheduler in this process
        from radixserve.engine.entrypoints.engine_core import EngineCore

        return EngineCore
    raise AttributeError(name)
