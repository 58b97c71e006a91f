"""Model sources: a HuggingFace Hub repo id resolves through the real HuggingFace cache.

No network here, so the Hub cache is laid out as `huggingface_hub` itself writes it (refs →
snapshot folder) and the hub client runs offline: the same code path a pod takes on its second
start, and the first one's after the download.
"""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub.constants as hub_constants
import pytest

from radixserve.engine.model_loader import resolve_model
from radixserve.engine.model_loader.source import ModelNotFoundError


def cached_snapshot(cache: Path, repo: str, ref: str, commit: str) -> Path:
    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / ref).write_text(commit)
    snapshot = repo_dir / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return snapshot


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    return tmp_path


def test_repo_id_resolves_to_the_cached_snapshot_of_its_revision(offline_cache: Path) -> None:
    main = cached_snapshot(offline_cache, "acme/tiny-llama", "main", "a" * 40)
    v1 = cached_snapshot(offline_cache, "acme/tiny-llama", "v1", "b" * 40)
    source = resolve_model("acme/tiny-llama")
    assert (source.kind, source.path, source.name) == ("hf", main.resolve(), "acme/tiny-llama")
    assert resolve_model("acme/tiny-llama", revision="v1").path == v1.resolve()


def test_an_unreachable_repo_is_one_clear_error(offline_cache: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="'acme/missing' is not a local path.*Hub"):
        resolve_model("acme/missing", revision="main")


def test_a_missing_local_path_is_not_mistaken_for_a_repo(offline_cache: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model("/no/such/model")
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model("just-a-name")
