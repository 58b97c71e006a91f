"""Server-side sampling defaults: what a request gets for the parameters it leaves unset.

`--generation-config` chooses where they come from, as vLLM's flag of the same name does:

- `auto` (default): the model's own `generation_config.json` (`temperature`, `top_p`, `top_k`,
  `repetition_penalty`; only the keys the file sets). A model without one gets the engine's
  neutral defaults, except the bundled SmolLM2 alias, whose GGUF carries no generation config:
  it gets `BUNDLED_DEFAULTS`, the settings of SmolLM2's model card (temperature 0.2,
  top_p 0.9). At temperature 1.0 a 135M model often answers gibberish.
- `vllm`: no server-side defaults; the engine's own (SGLang's: temperature 1.0, top_p 1.0,
  top_k −1, repetition_penalty 1.0).
- a path: a folder holding `generation_config.json`, or the file itself.

As in vLLM, `do_sample` is not read: a file that sets `temperature` samples with it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from radixserve.engine.model_loader.source import ALIASES, ModelSource

FILENAME = "generation_config.json"
KEYS = ("temperature", "top_p", "top_k", "repetition_penalty")
BUNDLED_DEFAULTS: Mapping[str, float] = MappingProxyType({"temperature": 0.2, "top_p": 0.9})


def read_generation_file(path: Path) -> dict[str, Any]:
    """The sampling keys a generation_config.json sets (a ValueError naming the flag if the
    file is not a JSON object)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"generation_config: cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"generation_config: {path} is not a JSON object")
    return {k: data[k] for k in KEYS if data.get(k) is not None}


def sampling_defaults(mode: str, source: ModelSource) -> dict[str, Any]:
    """The defaults `mode` gives for the model at `source` (see the module docstring)."""
    if mode == "vllm":
        return {}
    if mode != "auto":
        path = Path(mode).expanduser()
        return read_generation_file(path / FILENAME if path.is_dir() else path)
    own = source.directory / FILENAME
    if own.is_file():
        return read_generation_file(own)
    if source.name.lower() in ALIASES:
        return dict(BUNDLED_DEFAULTS)
    return {}
