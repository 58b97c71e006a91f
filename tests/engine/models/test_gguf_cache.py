"""The GGUF conversion cache: a SmolLM2 GGUF converted once into a HF-format folder loads the
same config, the same tensors (bit for bit) and a tokenizer that encodes and renders chat
exactly as transformers' own GGUF tokenizer does; a changed file gets a new folder, and an
unwritable cache falls back to reading the GGUF."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import PROMPTS

CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another one?"},
]


@pytest.fixture(scope="module")
def converted(smollm_source: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    from radixserve.engine.model_loader import gguf_cache

    root = tmp_path_factory.mktemp("gguf-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RADIXSERVE_CACHE_DIR", str(root))
        folder = gguf_cache.converted_folder(smollm_source.path)
    assert folder is not None and folder.parent == root / "gguf"
    return smollm_source, folder


def test_config_and_every_tensor_equal_the_gguf(converted: tuple[Any, Path]) -> None:
    from radixserve.engine.model_loader import gguf_files, hf_files

    source, folder = converted
    config = gguf_files.read_gguf_config(source.path)
    assert hf_files.read_hf_config(folder) == config
    cached = dict(hf_files.iter_safetensors(folder))
    direct = dict(gguf_files.iter_gguf_tensors(source.path, config))
    assert cached.keys() == direct.keys() and len(direct) > 0
    for name, tensor in direct.items():
        assert cached[name].dtype == torch.float32
        assert torch.equal(cached[name], tensor), name


def test_tokenizer_encodes_and_templates_as_the_gguf_one(converted: tuple[Any, Path]) -> None:
    from transformers import AutoTokenizer

    source, folder = converted
    ours = AutoTokenizer.from_pretrained(str(folder))
    ref = AutoTokenizer.from_pretrained(str(source.path.parent), gguf_file=source.path.name)
    for text in [*PROMPTS, "émoji 🚀 and\ttabs\n\nnew lines", "<|im_start|>user\nhi<|im_end|>"]:
        assert ours.encode(text) == ref.encode(text), text
    for kwargs in ({"add_generation_prompt": True}, {"add_generation_prompt": False}):
        assert ours.apply_chat_template(CHAT, tokenize=False, **kwargs) == (
            ref.apply_chat_template(CHAT, tokenize=False, **kwargs)
        )
    assert ours.eos_token_id == ref.eos_token_id and len(ours) == len(ref)


def test_a_changed_file_gets_a_new_key(tmp_path: Path) -> None:
    from radixserve.engine.model_loader.gguf_cache import cache_key

    f = tmp_path / "m.gguf"
    f.write_bytes(b"x" * 10)
    first = cache_key(f)
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert cache_key(f) != first
    f.write_bytes(b"y" * 11)
    assert cache_key(f).startswith("m-")


def test_an_unwritable_or_disabled_cache_reads_the_gguf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixserve.engine.model_loader.gguf_cache import converted_folder

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"not read: the cache root cannot be created")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(blocker / "below-a-file"))
    assert converted_folder(gguf) is None
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path / "fine"))
    monkeypatch.setenv("RADIXSERVE_GGUF_CACHE", "0")
    assert converted_folder(gguf) is None
    assert not (tmp_path / "fine").exists()


def test_a_folder_without_weights_reads_them_from_the_gguf(
    converted: tuple[Any, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model over MAX_CACHED_WEIGHT_BYTES caches config and tokenizer only."""
    import shutil

    from radixserve.engine.model_loader import load_model_files

    source, folder = converted
    light = tmp_path / "gguf" / folder.name
    shutil.copytree(folder, light, ignore=shutil.ignore_patterns("*.safetensors"))
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path))
    files = load_model_files(source, "float32")
    assert files.hf_config["vocab_size"] == 49152
    name, tensor = next(iter(files.weights()))
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        assert torch.equal(f.get_tensor(name), tensor)
