"""A GGUF file converted once into a HuggingFace-format folder, reused by every later load.

Parsing a GGUF is slow in Python: `gguf.GGUFReader` walks every metadata element (SmolLM2's
49k-token vocabulary and its merges are ~440k fields), and transformers parses the file again
to build the tokenizer. One server start loaded SmolLM2's GGUF seven times this way (config
twice in the main process, tokenizer in each of three processes, config and weights in the
scheduler), and that was most of the start-up time. The converted folder holds
`config.json`, the tokenizer as transformers saves it, and (for models up to
MAX_CACHED_WEIGHT_BYTES) the dequantized float32 weights as safetensors, so a load reads
files that open in milliseconds and tensors by memory map.

The folder is keyed by the GGUF's resolved path, size and mtime, plus a format version: a
changed file gets a new folder. Conversion runs under a file lock, so processes starting
together convert once; the folder appears by an atomic rename, complete or not at all.
If the cache cannot be written (read-only home, full disk), loading reads the GGUF directly.

`RADIXSERVE_CACHE_DIR` sets the cache root (default `$XDG_CACHE_HOME/radixserve`, else
`~/.cache/radixserve`); `RADIXSERVE_GGUF_CACHE=0` turns the cache off.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from radixserve.engine.model_loader import gguf_files

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
COMPLETE_MARKER = "radixserve-gguf.json"
# Dequantized float32 weights are 4-8x the GGUF's size: cached up to this (SmolLM2-135M takes
# 0.54 GB); a larger model's folder holds config and tokenizer only, its weights come from
# the GGUF (whose metadata the reader then parses once per process again).
MAX_CACHED_WEIGHT_BYTES = 4 << 30


def cache_root() -> Path:
    explicit = os.environ.get("RADIXSERVE_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "radixserve"


def cache_enabled() -> bool:
    return os.environ.get("RADIXSERVE_GGUF_CACHE", "1").lower() not in ("0", "false", "no")


def cache_key(gguf_path: Path) -> str:
    path = gguf_path.resolve()
    stat = path.stat()
    ident = f"{FORMAT_VERSION}:{path}:{stat.st_size}:{stat.st_mtime_ns}"
    return f"{path.stem}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def converted_folder(gguf_path: Path) -> Path | None:
    """The HF-format folder for `gguf_path`, converting it on first use; None when the cache
    is off or cannot be written (the caller then reads the GGUF itself)."""
    if not cache_enabled():
        return None
    root = cache_root() / "gguf"
    folder = root / cache_key(gguf_path)
    if (folder / COMPLETE_MARKER).is_file():
        return folder
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(root / f"{folder.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be converting it now
            if not (folder / COMPLETE_MARKER).is_file():
                _convert(gguf_path, folder)
    except OSError as exc:
        logger.info("GGUF cache unavailable (%s); reading %s directly", exc, gguf_path.name)
        return None
    return folder


def _convert(gguf_path: Path, folder: Path) -> None:
    """Write config, tokenizer and float32 weights into a temp folder, then rename it."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer  # engine extra; heavy import kept local

    logger.info("converting %s once into %s", gguf_path.name, folder)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        reader = gguf_files.open_reader(gguf_path)
        config = gguf_files.read_gguf_config(gguf_path, reader)
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        tokenizer.save_pretrained(str(tmp))
        with_weights = gguf_files.dequantized_bytes(reader) <= MAX_CACHED_WEIGHT_BYTES
        if with_weights:
            tensors = dict(gguf_files.iter_gguf_tensors(gguf_path, config, reader))
            save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        marker = {
            "source": str(gguf_path.resolve()),
            "format_version": FORMAT_VERSION,
            "weights": with_weights,
        }
        (tmp / COMPLETE_MARKER).write_text(json.dumps(marker))
        tmp.chmod(0o755)  # mkdtemp makes it private; a shared cache is read by other users
        if folder.exists():  # a partial folder from an older crash: never marked complete
            shutil.rmtree(folder)
        os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
