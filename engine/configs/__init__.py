"""Configuration objects of the engine."""

from radixserve.engine.configs.model_config import ModelConfig, RopeScaling
from radixserve.engine.configs.server_args import ServerArgs

__all__ = ["ModelConfig", "RopeScaling", "ServerArgs"]
