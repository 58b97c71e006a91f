"""One entry point from a ModelSource to (ModelConfig, weight iterator, tokenizer).

The model classes consume the iterator through their `load_weights`; this module never builds
a model, so it stays independent of the architecture registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from radixserve.engine.configs.model_config import ModelConfig
from radixserve.engine.model_loader import gguf_cache, gguf_files, hf_files
from radixserve.engine.model_loader.source import ModelSource
from radixserve.engine.model_loader.weight import Weight

WeightIterator = Iterator[tuple[str, torch.Tensor]]


@dataclass(frozen=True, slots=True)
class LoadedModelFiles:
    source: ModelSource
    config: ModelConfig
    hf_config: dict[str, Any]
    weights: Callable[[], WeightIterator]  # a fresh iterator on each call
    # Tensors read on demand (tensor parallelism: each rank reads its slices); GGUF yields
    # dequantized whole tensors here too, which the model slices.
    sharded_weights: Callable[[], Iterator[tuple[str, Weight]]]


def load_model_files(source: ModelSource, dtype: str | torch.dtype) -> LoadedModelFiles:
    # A GGUF goes through its converted folder when the cache has one (config and tokenizer
    # always, weights when small enough), else straight to the file.
    folder = gguf_cache.converted_folder(source.path) if source.kind == "gguf" else source.path
    if folder is not None:
        hf_config = hf_files.read_hf_config(folder)
        eos = hf_files.read_eos_token_ids(folder, hf_config)
    else:
        hf_config = gguf_files.read_gguf_config(source.path)
        eos = hf_files.read_eos_token_ids(None, hf_config)

    weights: Callable[[], WeightIterator]
    sharded: Callable[[], Iterator[tuple[str, Weight]]]
    if folder is not None and any(folder.glob("*.safetensors")):
        safetensors_folder = folder

        def weights() -> WeightIterator:
            return hf_files.iter_safetensors(safetensors_folder)

        def sharded() -> Iterator[tuple[str, Weight]]:
            return hf_files.iter_safetensors_lazy(safetensors_folder)

    else:

        def weights() -> WeightIterator:
            return gguf_files.iter_gguf_tensors(source.path, hf_config)

        sharded = weights

    config = ModelConfig.from_hf_dict(hf_config, dtype=dtype, eos_token_ids=eos)
    return LoadedModelFiles(
        source=source,
        config=config,
        hf_config=hf_config,
        weights=weights,
        sharded_weights=sharded,
    )


def load_tokenizer(source: ModelSource) -> Any:
    """A transformers fast tokenizer with the model's chat template (GGUF: converted by
    transformers from the file's vocabulary and merges)."""
    from transformers import AutoTokenizer  # engine extra; heavy import kept local

    if source.kind == "gguf":
        converted = gguf_cache.converted_folder(source.path)
        if converted is not None:
            return AutoTokenizer.from_pretrained(str(converted))
        return AutoTokenizer.from_pretrained(str(source.path.parent), gguf_file=source.path.name)
    return AutoTokenizer.from_pretrained(str(source.path))
