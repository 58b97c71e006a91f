"""Model architectures, one file each, looked up by the config's `architectures` name."""

from radixserve.engine.models.registry import get_model_class, supported_architectures

__all__ = ["get_model_class", "supported_architectures"]
