"""Model sources (HF directory, GGUF file, aliases), weight iterators and tokenizers."""

from radixserve.engine.model_loader.loader import LoadedModelFiles, load_model_files
from radixserve.engine.model_loader.source import ModelNotFoundError, ModelSource, resolve_model

__all__ = [
    "LoadedModelFiles",
    "ModelNotFoundError",
    "ModelSource",
    "load_model_files",
    "resolve_model",
]
