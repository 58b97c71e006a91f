"""Tiny random-weight DeepSeek-V2 (no q_lora_rank, softmax group-limited routing, two shared
experts) and DeepSeek-V3 (q_lora_rank, sigmoid routing with e_score_correction_bias) checkpoints
written by transformers, loaded by our loader: batched prefill and decode logits equal
transformers' per-prompt logits within 1e-4 (float32), through absorbed MLA over the latent
pool, on both CPU backends (the PyTorch reference `torch` and `grouped`) at page sizes 1 and 16.

Also: the routers against transformers' own router modules (ids and weights), the latent pool's
bytes per token against the formula and against an un-absorbed (per-head K/V) cache, the V3 MTP
layer skipped with a log line, and the config parsing of every DeepSeek field.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.models.tiny import (
    DEEPSEEK_KINDS,
    EngineBatch,
    Tiny,
    hf_last_logits,
    random_prompts,
    save_tiny,
    tiny_models,
)

TOL = {"atol": 1e-4, "rtol": 1e-4}
LENGTHS = (3, 17, 40, 9, 100)  # 100 > original_max_position_embeddings (64): YaRN matters
KINDS = list(DEEPSEEK_KINDS)
LAYOUTS = [("torch", 1), ("grouped", 1), ("torch", 16), ("grouped", 16)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Tiny]]:
    """Each kind saved and loaded once per module (torch backend, page 1)."""

    def save(kind: str, folder: Path) -> Any:
        return save_tiny(kind, folder, seed=40 + KINDS.index(kind))

    with tiny_models(tmp_path_factory, save, attention_backend="torch") as get:
        yield get


def _engine(t: Tiny, backend: str, page: int) -> Any:
    if (backend, page) == ("torch", 1):
        return t.engine
    return t.engine.with_args(attention_backend=backend, page_size=page, max_total_tokens=2048)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("backend", "page"), LAYOUTS)
def test_prefill_and_decode_match_transformers(
    tiny: Callable[[str], Tiny], kind: str, backend: str, page: int
) -> None:
    t = tiny(kind)
    engine = _engine(t, backend, page)
    if backend == "grouped" and shutil.which("g++"):  # decode rows take the C++ MLA kernel
        assert engine.runner.attn_backend._mla_kernel is not None
    prompts = random_prompts(LENGTHS, seed=1)
    eb = EngineBatch(engine, prompts)
    logits = eb.prefill()
    ref = torch.stack([hf_last_logits(t.hf, ids) for ids in prompts])
    assert ref.std() > 0.3, "degenerate logits would make the comparison meaningless"
    seqs = [list(p) for p in prompts]
    try:
        torch.testing.assert_close(logits, ref, **TOL)
        for _step in range(2):  # DECODE forwards: one token per request over the latent rows
            tokens = logits.argmax(-1).tolist()
            for seq, tok in zip(seqs, tokens, strict=True):
                seq.append(tok)
            logits = eb.decode(tokens)
            ref = torch.stack([hf_last_logits(t.hf, s) for s in seqs])
            torch.testing.assert_close(logits, ref, **TOL)
    finally:
        eb.release()
    engine.scheduler.check_memory_invariant()


def test_latent_pool_bytes_per_token(tiny: Callable[[str], Tiny]) -> None:
    """(kv_lora_rank + qk_rope_head_dim) × layers × dtype size, measured on the buffers; an
    un-absorbed cache (per-head k of nope + rope and v) would hold H·(qk + v) per layer."""
    from radixserve.engine.mem_cache import MLATokenToKVPool

    t = tiny("deepseek_v3")
    c = t.engine.model_config
    m = c.mla
    pool = t.engine.runner.token_to_kv_pool
    assert isinstance(pool, MLATokenToKVPool)
    layers, elem = c.num_hidden_layers, 4
    latent = (m.kv_lora_rank + m.qk_rope_head_dim) * layers * elem
    assert pool.bytes_per_token() == latent == (32 + 16) * 3 * 4
    assert pool.k_buffer[0].shape[1:] == (1, 48)
    assert pool.v_buffer[0].data_ptr() == pool.k_buffer[0].data_ptr()  # a view, no bytes
    expanded = c.num_attention_heads * (m.qk_head_dim + m.v_head_dim) * layers * elem
    print(f"latent {latent} B/token vs un-absorbed {expanded} B/token ({expanded / latent:.1f}x)")
    assert expanded / latent == pytest.approx(4 * (48 + 24) / 48)


@pytest.mark.parametrize("kind", KINDS)
def test_router_matches_transformers_router(tiny: Callable[[str], Tiny], kind: str) -> None:
    """Our route() against the HF TopkRouter of the same layer, on hidden states that spread
    over every group: the same experts per token, the same weights (scaled, V3 renormalised)."""
    t = tiny(kind)
    ours = t.engine.runner.model.model.layers[1].mlp.gate
    hf_gate = t.hf.model.layers[1].mlp.gate
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(5))
    _logits, hf_w, hf_ids = hf_gate(x)
    topk = ours.route(x)
    order_ours, order_hf = topk.ids.argsort(-1), hf_ids.argsort(-1)
    assert torch.equal(topk.ids.gather(1, order_ours), hf_ids.gather(1, order_hf))
    torch.testing.assert_close(topk.weights.gather(1, order_ours), hf_w.gather(1, order_hf))
    assert len(topk.ids.unique()) == 8  # routing is not degenerate
    if kind == "deepseek_v3":  # the bias changes choices: without it some tokens differ
        from radixserve.engine.layers.moe_router import route

        unbiased = route(ours(x), ours.moe, None)
        assert not torch.equal(unbiased.ids.sort(-1).values, topk.ids.sort(-1).values)


def test_config_fields_are_parsed(tiny: Callable[[str], Tiny]) -> None:
    v2 = tiny("deepseek_v2").engine.model_config
    v3 = tiny("deepseek_v3").engine.model_config
    assert v2.mla is not None and v3.mla is not None and v2.moe is not None and v3.moe is not None
    assert (v2.mla.q_lora_rank, v3.mla.q_lora_rank) == (None, 48)
    assert (v3.mla.kv_lora_rank, v3.mla.qk_nope_head_dim, v3.mla.qk_rope_head_dim) == (32, 32, 16)
    assert v3.mla.v_head_dim == 24 and v3.head_dim == 16 and v3.mla.rope_interleave
    assert (v2.moe.scoring_func, v3.moe.scoring_func) == ("softmax", "sigmoid")
    assert (v2.moe.correction_bias, v3.moe.correction_bias) == (False, True)
    assert (v3.moe.n_group, v3.moe.topk_group, v3.moe.routed_scaling_factor) == (4, 2, 2.5)
    assert v2.moe.shared_expert_intermediate_size == 64 and not v2.moe.shared_expert_gated
    assert v2.moe.mlp_only_layers == (0,) and v3.moe.mlp_only_layers == (0,)
    assert (v2.rope_scaling.mscale, v2.rope_scaling.mscale_all_dim) == (0.707, 0.8)
    assert v3.num_nextn_predict_layers == 1


def test_v3_mtp_layer_is_skipped_with_a_log_line(
    tiny: Callable[[str], Tiny], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint with `model.layers.3.*` (the MTP layer after 3 decoder layers) loads, says
    it skipped that layer, and gives the same logits."""
    from safetensors.torch import load_file, save_file

    from radixserve.engine import EngineCore

    t = tiny("deepseek_v3")
    tensors = load_file(str(t.folder / "model.safetensors"))
    last = "model.layers.2."
    mtp = {
        "model.layers.3." + k.removeprefix(last): v.clone()
        for k, v in tensors.items()
        if k.startswith(last)
    }
    mtp["model.layers.3.eh_proj.weight"] = torch.zeros(64, 128)
    save_file({**tensors, **mtp}, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    for f in t.folder.iterdir():
        if f.name != "model.safetensors":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    with caplog.at_level(logging.INFO, logger="radixserve.engine.models.deepseek_v2"):
        engine = EngineCore(model_path=str(tmp_path), max_total_tokens=512, dtype="float32")
    try:
        assert any("MTP layer(s) [3]" in r.getMessage() for r in caplog.records)
        prompts = random_prompts((7, 30), seed=9)
        eb = EngineBatch(engine, prompts)
        ours = eb.prefill()
        eb.release()
        ref = torch.stack([hf_last_logits(t.hf, ids) for ids in prompts])
        torch.testing.assert_close(ours, ref, **TOL)
    finally:
        engine.shutdown()


def test_flashinfer_refuses_mla_clearly(tiny: Callable[[str], Tiny]) -> None:
    """FlashInfer's MLA wrapper is not wired: the refusal names the backends that take MLA
    (triton among them: tests/engine/attention/test_triton_backend.py)."""
    t = tiny("deepseek_v2")
    with pytest.raises(ValueError, match=r"\(MLA\) runs on .*triton"):
        t.engine.with_args(attention_backend="flashinfer")
