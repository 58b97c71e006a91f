"""Tiny random-weight Qwen3-MoE, Mixtral and Qwen2-MoE checkpoints (2 layers, hidden 64, 8
experts, top-2, float32): our batched prefill and decode logits equal transformers' per-prompt
logits within 1e-4, loaded by our loader from what `save_pretrained` wrote (per-expert tensors,
as Hub checkpoints hold them; and transformers 5's stacked experts).

The cases cover both normalisations (renormalised top-k: Qwen3-MoE, Mixtral; plain: Qwen2-MoE),
a dense layer among sparse ones (Qwen3-MoE's `mlp_only_layers`), Mixtral's `block_sparse_moe`
and w1/w3/w2 names, and Qwen2-MoE's q/k/v biases with its sigmoid-gated shared expert.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve.engine.layers.moe import FusedMoE, SparseMoeBlock
from radixserve.engine.models.llama import LlamaMLP
from tests.engine.models.tiny import (
    MOE_KINDS,
    EngineBatch,
    Tiny,
    hf_last_logits,
    random_prompts,
    save_tiny,
    tiny_models,
)

TOL = {"atol": 1e-4, "rtol": 1e-4}
LENGTHS = (3, 17, 40, 9, 100)
KINDS = list(MOE_KINDS)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Tiny]]:
    """Build each MoE kind once per module, on first use."""

    def save(kind: str, folder: Path) -> Any:
        return save_tiny(kind, folder, seed=10 + KINDS.index(kind))

    with tiny_models(tmp_path_factory, save) as get:
        yield get


def _max_diff(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours - ref).abs().max())


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_matches_transformers(tiny: Callable[[str], Tiny], kind: str) -> None:
    t = tiny(kind)
    prompts = random_prompts(LENGTHS, seed=1)
    eb = EngineBatch(t.engine, prompts)
    ours = eb.prefill()
    eb.release()
    ref = torch.stack([hf_last_logits(t.hf, ids) for ids in prompts])
    assert ref.std() > 0.3, "degenerate logits would make the comparison meaningless"
    torch.testing.assert_close(ours, ref, **TOL)
    print(f"{kind} prefill max|Δ|={_max_diff(ours, ref):.2e}")


@pytest.mark.parametrize("kind", KINDS)
def test_decode_matches_transformers(tiny: Callable[[str], Tiny], kind: str) -> None:
    """Two DECODE steps (one token per request through the MoE) after a batched prefill."""
    t = tiny(kind)
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
            print(f"{kind} decode {step} max|Δ|={_max_diff(logits, ref):.2e}")
    finally:
        eb.release()
    t.engine.scheduler.check_memory_invariant()


@pytest.mark.parametrize("kind", KINDS)
def test_experts_are_loaded_stacked_and_routing_is_nontrivial(
    tiny: Callable[[str], Tiny], kind: str
) -> None:
    """Our w13 / w2 equal transformers' stacked experts exactly; the prompts use most experts."""
    t = tiny(kind)
    ours = t.engine.runner.model.model.layers
    sparse = [i for i, layer in enumerate(ours) if isinstance(layer.mlp, SparseMoeBlock)]
    assert sparse == ([0] if kind == "qwen3_moe" else [0, 1])
    for i in sparse:
        hf_experts, block = t.hf.model.layers[i].mlp.experts, ours[i].mlp
        torch.testing.assert_close(block.experts.w13_weight, hf_experts.gate_up_proj, **TOL)
        torch.testing.assert_close(block.experts.w2_weight, hf_experts.down_proj, **TOL)
        assert (block.shared_expert is not None) is (kind == "qwen2_moe")
        x = t.hf.model.embed_tokens(torch.tensor(random_prompts((64,), seed=3)[0]))
        used = block.gate(x).topk(2, dim=-1).indices.unique()
        assert len(used) >= 6, "a router that sends everything to two experts tests little"
    if kind == "qwen3_moe":
        assert isinstance(ours[1].mlp, LlamaMLP)  # mlp_only_layers: dense


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_transformers5_stacked_checkpoint_loads_the_same(
    tiny: Callable[[str], Tiny], kind: str, tmp_path: Path
) -> None:
    """`save_pretrained(save_original_format=False)` writes `mlp.experts.gate_up_proj` [E, 2I, H]
    and `down_proj` [E, H, I]; loading those gives the same logits."""
    from radixserve.engine import EngineCore

    t = tiny(kind)
    from safetensors import safe_open

    t.hf.save_pretrained(str(tmp_path), save_original_format=False)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert "model.layers.1.mlp.experts.gate_up_proj" in set(f.keys())
    for tok_file in t.folder.glob("tok*"):
        (tmp_path / tok_file.name).write_bytes(tok_file.read_bytes())
    engine = EngineCore(model_path=str(tmp_path), max_total_tokens=512, dtype="float32")
    try:
        prompts = random_prompts((5, 30), seed=4)
        eb = EngineBatch(engine, prompts)
        ours = eb.prefill()
        eb.release()
        ref = torch.stack([hf_last_logits(t.hf, ids) for ids in prompts])
        torch.testing.assert_close(ours, ref, **TOL)
    finally:
        engine.shutdown()


def test_a_missing_expert_matrix_is_an_error(tiny: Callable[[str], Tiny]) -> None:
    from radixserve.engine.model_loader.hf_files import iter_safetensors
    from radixserve.engine.models import get_model_class

    t = tiny("mixtral")
    config = t.engine.model_config
    dropped = "model.layers.1.block_sparse_moe.experts.5.w3.weight"
    weights = ((n, w) for n, w in iter_safetensors(t.folder) if n != dropped)
    model = get_model_class(config.architecture)(config)
    missing = r"missing expert weights.*'model.layers.1.mlp.experts', 5, 'w3'"
    with pytest.raises(ValueError, match=missing):
        model.load_weights(weights)


def test_moe_config_is_parsed_per_architecture(tiny: Callable[[str], Tiny]) -> None:
    qwen3, mixtral, qwen2 = (tiny(k).engine.model_config for k in KINDS)
    assert qwen3.moe is not None and mixtral.moe is not None and qwen2.moe is not None
    assert (qwen3.moe.num_experts, qwen3.moe.top_k, qwen3.moe.mlp_only_layers) == (8, 2, (1,))
    assert qwen3.moe.norm_topk_prob and qwen3.qk_norm and not qwen3.attention_bias
    assert mixtral.moe.norm_topk_prob and mixtral.moe.moe_intermediate_size == 32
    assert not qwen2.moe.norm_topk_prob and qwen2.attention_bias
    assert qwen2.moe.shared_expert_intermediate_size == 48
    layer = tiny("qwen2_moe").engine.runner.model.model.layers[0].mlp
    assert isinstance(layer.experts, FusedMoE) and layer.shared_expert_gate is not None
