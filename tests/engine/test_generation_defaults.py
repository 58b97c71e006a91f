"""--generation-config: sampling defaults from a model folder's generation_config.json (written
and read back by transformers' GenerationConfig, the oracle), the bundled SmolLM2's documented
defaults, `vllm` (none) and a path; requests that leave a field unset get the default, and a
field the request sets wins, on the OpenAI and native routes alike."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType, SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from transformers import GenerationConfig

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.entrypoints.http_errors import install_error_handlers
from radixserve.engine.entrypoints.openai_serving import install_openai_routes
from radixserve.engine.entrypoints.request_builder import ServerLimits
from radixserve.engine.entrypoints.serve import _sampling_defaults
from radixserve.engine.model_loader.generation_defaults import (
    BUNDLED_DEFAULTS,
    KEYS,
    sampling_defaults,
)
from radixserve.engine.model_loader.source import ModelSource
from tests.engine.server.test_openai_unit import FakeTM, FakeTokenizer

QWEN3_LIKE = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.05}


def model_dir(tmp_path: Path, **gen: object) -> ModelSource:
    """An HF-format folder whose generation_config.json transformers itself wrote."""
    GenerationConfig(do_sample=True, **gen).save_pretrained(tmp_path)
    return ModelSource("hf", tmp_path, tmp_path.name)


def test_auto_reads_what_transformers_reads(tmp_path: Path) -> None:
    source = model_dir(tmp_path, **QWEN3_LIKE)
    oracle = GenerationConfig.from_pretrained(tmp_path)
    assert sampling_defaults("auto", source) == {k: getattr(oracle, k) for k in KEYS}


def test_auto_takes_only_the_keys_the_file_sets(tmp_path: Path) -> None:
    source = model_dir(tmp_path, temperature=0.7)
    assert sampling_defaults("auto", source) == {"temperature": 0.7}


def test_vllm_and_paths(tmp_path: Path) -> None:
    source = model_dir(tmp_path / "model", **QWEN3_LIKE)
    other = model_dir(tmp_path / "other", temperature=0.3)
    assert sampling_defaults("vllm", source) == {}
    assert sampling_defaults(str(other.path), source) == {"temperature": 0.3}
    assert sampling_defaults(str(other.path / "generation_config.json"), source) == {
        "temperature": 0.3
    }


def test_bundled_smollm2_gets_the_documented_defaults(tmp_path: Path) -> None:
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"  # no generation_config.json beside it
    assert sampling_defaults("auto", ModelSource("gguf", gguf, "smollm2-135m")) == dict(
        BUNDLED_DEFAULTS
    )
    assert sampling_defaults("auto", ModelSource("gguf", gguf, gguf.stem)) == {}
    assert sampling_defaults("vllm", ModelSource("gguf", gguf, "smollm2-135m")) == {}


def test_bad_values_fail_at_start_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="generation_config"):
        ServerArgs(generation_config=str(tmp_path / "missing"))
    (tmp_path / "generation_config.json").write_text('{"top_p": 0.0}')
    args = ServerArgs(generation_config=str(tmp_path))
    with pytest.raises(ValueError, match="^generation_config: top_p"):
        _sampling_defaults(args, ModelSource("hf", tmp_path, "m"), 100)


@pytest.fixture()
def served(tmp_path: Path) -> tuple[TestClient, FakeTM]:
    defaults = sampling_defaults("auto", model_dir(tmp_path, **QWEN3_LIKE))
    tok = FakeTokenizer()
    tm = FakeTM(tok)
    app = FastAPI()
    app.state.server = SimpleNamespace(
        args=SimpleNamespace(model_name="m", tool_call_parser=None, reasoning_parser=None),
        tokenizer=tok,
        tokenizer_manager=tm,
        model_info={"context_length": 64},
        limits=ServerLimits(64, 60, 100, sampling_defaults=MappingProxyType(defaults)),
    )
    install_error_handlers(app)
    install_openai_routes(app)
    return TestClient(app), tm


def test_unset_fields_get_the_defaults_and_set_ones_win(served: tuple[TestClient, FakeTM]) -> None:
    client, tm = served
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert client.post("/v1/chat/completions", json=chat).status_code == 200
    params = tm.seen[-1].sampling_params
    assert {k: getattr(params, k) for k in KEYS} == QWEN3_LIKE
    body = {"prompt": "hi", "max_tokens": 2, "temperature": 1.0, "top_k": -1}
    assert client.post("/v1/completions", json=body).status_code == 200
    params = tm.seen[-1].sampling_params
    assert (params.temperature, params.top_k, params.top_p) == (1.0, -1, 0.95)
    greedy = {"prompt": "hi", "max_tokens": 2, "temperature": 0}
    assert client.post("/v1/completions", json=greedy).status_code == 200
    assert tm.seen[-1].sampling_params.is_greedy
