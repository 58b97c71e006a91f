"""Configuration objects of the engine. Import ModelConfig from `model_config` (it needs
torch); this package itself stays torch-free so the CLI can build flags without torch."""

from __future__ import annotations

from radixserve.engine.configs.server_args import ServerArgs

__all__ = ["ServerArgs"]
