"""Tiny random-weight Llama / Qwen2 / Qwen3 checkpoints (float32): our batched prefill and
decode logits equal transformers' per-prompt unpadded logits within 1e-4.

Each checkpoint is written by transformers (`save_pretrained`, safetensors) and loaded by our
loader through `Engine(model_path=folder)`, so config parsing, weight fusing, tying, biases,
q/k norms and the rope-scaling variants are all checked end to end against the HF oracle.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.models.tiny import (
    MAX_POS,
    EngineBatch,
    Tiny,
    hf_last_logits,
    random_prompts,
    save_tiny,
    tiny_models,
)

TOL = {"atol": 1e-4, "rtol": 1e-4}
LENGTHS = (3, 17, 40, 9, 100)  # 100 > original_max_position_embeddings of the scaled ropes
ORIG_MAX = 64

ROPES: dict[str, dict[str, Any]] = {
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": ORIG_MAX,
    },
    "linear": {"rope_type": "linear", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIG_MAX},
}

# name → (architecture kind, config overrides)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {"tie_word_embeddings": True}),
    "qwen2": ("qwen2", {"tie_word_embeddings": False}),
    # head_dim 32 ≠ hidden / heads: q_size differs from hidden_size
    "qwen3": ("qwen3", {"tie_word_embeddings": True, "head_dim": 32}),
    # HF's attention_bias on Llama biases q/k/v and o_proj
    "llama-bias": ("llama", {"tie_word_embeddings": False, "attention_bias": True}),
    **{
        f"llama-{name}": ("llama", {"tie_word_embeddings": False, "rope_scaling": rope})
        for name, rope in ROPES.items()
    },
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Tiny]]:
    """Build each case once per module, on first use."""

    def save(name: str, folder: Path) -> Any:
        kind, overrides = CASES[name]
        return save_tiny(kind, folder, seed=list(CASES).index(name), **overrides)

    with tiny_models(tmp_path_factory, save) as get:
        yield get


def _max_diff(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours - ref).abs().max())


@pytest.mark.parametrize("name", list(CASES))
def test_prefill_matches_transformers(tiny: Callable[[str], Tiny], name: str) -> None:
    t = tiny(name)
    prompts = random_prompts(LENGTHS, seed=1)
    eb = EngineBatch(t.engine, prompts)
    ours = eb.prefill()
    eb.release()
    ref = torch.stack([hf_last_logits(t.hf, ids) for ids in prompts])
    assert ours.shape == (len(prompts), t.engine.model_config.vocab_size)
    assert ref.std() > 0.3, "degenerate logits would make the comparison meaningless"
    torch.testing.assert_close(ours, ref, **TOL)
    print(f"{name} prefill max|Δ|={_max_diff(ours, ref):.2e}")


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "llama-yarn"])
def test_decode_matches_transformers(tiny: Callable[[str], Tiny], name: str) -> None:
    """Two DECODE steps after a batched prefill (greedy tokens appended) through the paged
    KV cache equal transformers on the extended prompts."""
    t = tiny(name)
    prompts = random_prompts(LENGTHS, seed=2)
    eb = EngineBatch(t.engine, prompts)
    logits = eb.prefill()
    seqs = [list(p) for p in prompts]
    try:
        for step in range(2):
            tokens = logits.argmax(-1).tolist()
            for seq, tok in zip(seqs, tokens, strict=True):
                seq.append(tok)
            logits = eb.decode(tokens)
            ref = torch.stack([hf_last_logits(t.hf, s) for s in seqs])
            torch.testing.assert_close(logits, ref, **TOL)
            print(f"{name} decode {step} max|Δ|={_max_diff(logits, ref):.2e}")
    finally:
        eb.release()
    t.engine.scheduler.check_memory_invariant()


def test_mixed_batch_equals_single_requests(tiny: Callable[[str], Tiny]) -> None:
    """Batching does not leak between requests: each row equals the prompt run alone."""
    t = tiny("qwen2")
    prompts = random_prompts(LENGTHS, seed=3)
    eb = EngineBatch(t.engine, prompts)
    batched = eb.prefill()
    eb.release()
    for i, ids in enumerate(prompts):
        single = EngineBatch(t.engine, [ids])
        torch.testing.assert_close(single.prefill()[0], batched[i], **TOL)
        single.release()


def _checkpoint_names(folder: Any) -> set[str]:
    from safetensors import safe_open

    names: set[str] = set()
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as f:
            names.update(f.keys())
    return names


@pytest.mark.parametrize("name", ["qwen2", "llama-bias"])
def test_attention_biases_are_nonzero_and_loaded(tiny: Callable[[str], Tiny], name: str) -> None:
    """Qwen2: q/k/v biases only; Llama with attention_bias: q/k/v and o_proj biases."""
    t = tiny(name)
    assert t.engine.model_config.attention_bias
    for i, layer in enumerate(t.hf.model.layers):
        hf_attn, ours = layer.self_attn, t.engine.runner.model.model.layers[i].self_attn
        hf_bias = torch.cat([hf_attn.q_proj.bias, hf_attn.k_proj.bias, hf_attn.v_proj.bias])
        assert hf_bias.abs().min() > 0
        torch.testing.assert_close(ours.qkv_proj.bias.cpu(), hf_bias.detach(), atol=0, rtol=0)
        if hf_attn.o_proj.bias is None:
            assert ours.o_proj.bias is None
        else:
            assert hf_attn.o_proj.bias.abs().min() > 0
            torch.testing.assert_close(
                ours.o_proj.bias.cpu(), hf_attn.o_proj.bias.detach(), atol=0, rtol=0
            )
    assert (name == "llama-bias") is (t.hf.model.layers[0].self_attn.o_proj.bias is not None)


def test_qwen3_qk_norms_are_nontrivial_and_loaded(tiny: Callable[[str], Tiny]) -> None:
    t = tiny("qwen3")
    assert t.engine.model_config.qk_norm and t.engine.model_config.head_dim == 32
    for i, layer in enumerate(t.hf.model.layers):
        ours = t.engine.runner.model.model.layers[i].self_attn
        assert ours.q_norm is not None and ours.k_norm is not None
        for hf_norm, our_norm in (
            (layer.self_attn.q_norm, ours.q_norm),
            (layer.self_attn.k_norm, ours.k_norm),
        ):
            assert (hf_norm.weight - 1).abs().max() > 0.1
            torch.testing.assert_close(
                our_norm.weight.detach().cpu(), hf_norm.weight.detach(), atol=0, rtol=0
            )


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3"])
def test_word_embedding_tying(tiny: Callable[[str], Tiny], name: str) -> None:
    t = tiny(name)
    tied = CASES[name][1]["tie_word_embeddings"]
    model = t.engine.runner.model
    assert t.engine.model_config.tie_word_embeddings is tied
    assert (model.lm_head.weight is model.model.embed_tokens.weight) is tied
    if not tied:
        assert "lm_head.weight" in _checkpoint_names(t.folder)
        assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    torch.testing.assert_close(
        model.lm_head.weight.detach().cpu(), t.hf.lm_head.weight.detach(), atol=0, rtol=0
    )


@pytest.mark.parametrize("rope", list(ROPES))
def test_rope_config_round_trips(tiny: Callable[[str], Tiny], rope: str) -> None:
    """transformers 5 writes `rope_parameters`; the legacy `rope_scaling` + `rope_theta` form
    of the same config parses to the same ModelConfig."""
    from radixserve.engine.configs.model_config import ModelConfig

    t = tiny(f"llama-{rope}")
    saved = json.loads((t.folder / "config.json").read_text())
    params = saved.get("rope_parameters") or saved["rope_scaling"]
    assert params["rope_type"] == ROPES[rope]["rope_type"]
    parsed = t.engine.model_config
    assert parsed.max_position_embeddings == MAX_POS
    assert parsed.rope_theta == params["rope_theta"]
    s = parsed.rope_scaling
    assert s.rope_type == ROPES[rope]["rope_type"] and s.factor == ROPES[rope]["factor"]
    assert s.original_max_position_embeddings == ROPES[rope].get("original_max_position_embeddings")
    legacy = {k: v for k, v in saved.items() if k != "rope_parameters"}
    legacy["rope_theta"] = params["rope_theta"]
    legacy["rope_scaling"] = {"type": ROPES[rope]["rope_type"], **ROPES[rope]}
    del legacy["rope_scaling"]["rope_type"]
    assert ModelConfig.from_hf_dict(legacy) == ModelConfig.from_hf_dict(saved)
