"""Reads a HuggingFace-format folder: config.json, generation_config.json, *.safetensors.

Owns file parsing only; the model classes decide what each tensor means.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from radixserve.engine.model_loader.weight import LazyWeight


def read_hf_config(folder: Path) -> dict[str, Any]:
    with open(folder / "config.json") as f:
        config: dict[str, Any] = json.load(f)
    return config


def read_eos_token_ids(folder: Path | None, config: dict[str, Any]) -> tuple[int, ...]:
    """EOS ids from generation_config.json (preferred, as HF generate does) else config.json."""
    value = config.get("eos_token_id")
    gen_path = folder / "generation_config.json" if folder else None
    if gen_path is not None and gen_path.is_file():
        with open(gen_path) as f:
            value = json.load(f).get("eos_token_id", value)
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, list) else (int(value),)


def iter_safetensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open  # heavy optional dependency of the engine extra

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield name, f.get_tensor(name)


def iter_safetensors_lazy(folder: Path) -> Iterator[tuple[str, LazyWeight]]:
    """Like `iter_safetensors`, but each tensor is read only when (and as far as) the model
    slices it; a handle is valid until the iterator advances to the next file."""
    from safetensors import safe_open  # heavy optional dependency of the engine extra

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield name, LazyWeight(f.get_slice(name))
