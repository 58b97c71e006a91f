"""The Triton attention backend end to end: greedy tokens equal to the torch reference backend.

On a machine without CUDA the kernels run under TRITON_INTERPRET=1 (set below, before any
kernel module is imported: Triton reads it when a kernel is decorated), so this tests the
backend's bookkeeping (kv indices from kv_rows, qo_indptr, prefix lengths, KV store slots)
on a tiny random-weight Llama, not speed. The batch mixes what the scheduler produces: a
shared prefix served from the radix cache, prompts longer than the chunk (chunked prefill,
extends over a cached prefix) and decode steps, at page sizes 1 and 16 (MIXED forwards take
the extend path, decodes as extends of one over their prefix; this batch does not produce
one). The same test runs compiled on a GPU (`gpu` case). MLA (values narrower than keys) runs
the same way on a tiny DeepSeek-V3.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.engine.models.tiny import random_prompts, save_tiny  # noqa: E402

NEW_TOKENS = 3
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
# head_dim 16 (hidden 64 / 4 heads), 2 KV heads: GQA groups of 2
TINY = {"num_hidden_layers": 2}


def mixed_prompts() -> list[list[int]]:
    """Two prompts sharing a 24-token prefix (the second hits the first's cache), one longer
    than the 16-token chunk, one short."""
    prefix, a, b, c = random_prompts((24, 5, 9, 7), seed=5)
    return [prefix + a, prefix + b, c, prefix + prefix[:10]]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("triton-llama")
    save_tiny("llama", folder, seed=7, **TINY)
    return folder


def generate(
    folder: Path, backend: str, device: str, ops: Any = None, **args: Any
) -> tuple[list[Any], int]:
    """Greedy outputs of `mixed_prompts` and the tokens the second batch found cached. `ops`:
    fused ops to hand every norm / activation / rotary / MoE module after start-up."""
    from radixserve.engine import EngineCore
    from radixserve.engine.attention.triton_backend import TritonAttnBackend
    from radixserve.engine.model_executor.model_runner import attach_fused_ops

    engine = EngineCore(
        model_path=str(folder), device=device, dtype="float32", attention_backend=backend,
        max_total_tokens=1024, skip_server_warmup=True, **args,
    )  # fmt: skip
    try:
        assert isinstance(engine.runner.attn_backend, TritonAttnBackend) == (backend == "triton")
        if ops is not None:
            attach_fused_ops(engine.runner.model, ops, ops)
        prompts = mixed_prompts()
        # The first prompt alone first, so the second batch extends over its cached prefix.
        first = engine.generate(input_ids=prompts[:1], sampling_params=GREEDY)
        rest = engine.generate(input_ids=prompts[1:], sampling_params=GREEDY)
        engine.scheduler.check_memory_invariant()
        cached = sum(o["meta_info"]["cached_tokens"] for o in rest)
        return [o["output_ids"] for o in first + rest], cached
    finally:
        engine.shutdown()


DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device")]),
]  # fmt: skip


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.param


@pytest.mark.parametrize("page_size", [1, 16])
def test_triton_backend_greedy_equals_torch(tiny_folder: Path, device: str, page_size: int) -> None:
    args = {"page_size": page_size, "chunked_prefill_size": 16}
    expected, _ = generate(tiny_folder, "torch", device, **args)
    got, cached = generate(tiny_folder, "triton", device, **args)
    assert got == expected
    assert all(len(out) == NEW_TOKENS for out in got)
    assert cached >= 16  # the shared prefix was read from the pool through kv_indices


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("page_size", [1, 16])
def test_mla_greedy_equals_torch(tmp_path: Path, page_size: int) -> None:
    """Absorbed MLA (tiny DeepSeek-V3: one 48-wide latent KV head, values its first 32
    columns) through the Triton decode and extend kernels: the torch reference's tokens, over a
    cached prefix and chunked prefill."""
    save_tiny("deepseek_v3", tmp_path, seed=3)
    args = {"page_size": page_size, "chunked_prefill_size": 16}
    expected, _ = generate(tmp_path, "torch", "cpu", **args)
    got, cached = generate(tmp_path, "triton", "cpu", **args)
    assert got == expected
    assert cached >= 16


def test_graph_runner_padding_keeps_tokens(tiny_folder: Path) -> None:
    """The CUDA-graph decode path's bookkeeping without a graph (capture=False runs the padded
    static batch eagerly): 3 decoding requests padded to the bs-4 size, padding rows reading
    and writing only slot 0, must give the torch backend's tokens."""
    from radixserve.engine import EngineCore
    from radixserve.engine.model_executor.cuda_graph_runner import CudaGraphRunner

    prompts = random_prompts((13, 6, 20), seed=8)
    args = {"model_path": str(tiny_folder), "dtype": "float32", "max_total_tokens": 1024}
    reference = EngineCore(attention_backend="torch", **args)
    try:
        expected = reference.generate(input_ids=prompts, sampling_params=GREEDY)
    finally:
        reference.shutdown()
    engine = EngineCore(attention_backend="triton", page_size=16, **args)
    try:
        runner = engine.runner
        static = CudaGraphRunner(
            runner.model, runner.attn_backend, runner.req_to_token_pool,
            runner.token_to_kv_pool, 4, runner.device, capture=False,
        )  # fmt: skip
        assert static.sizes == [1, 2, 4]
        runner.graph_runner = static
        got = engine.generate(input_ids=prompts, sampling_params=GREEDY)
        engine.scheduler.check_memory_invariant()
    finally:
        engine.shutdown()
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in expected]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("page_size", [1, 16])
def test_mixed_forward_matches_the_reference(page_size: int) -> None:
    """One MIXED forward (a new prefill chunk, a chunk over a cached prefix, three running
    decodes) through the triton backend and the torch reference on the same pool, float32."""
    from radixserve.engine.attention import create_attention_backend
    from radixserve.engine.forward_batch import ForwardMode
    from radixserve.engine.layers.radix_attention import RadixAttention
    from tests.engine.attention.test_grouped_backend import (
        HEAD_DIM,
        TOLERANCE,
        make_batch,
        make_pools,
        prefill,
    )

    layer = RadixAttention(4, HEAD_DIM, HEAD_DIM**-0.5, 2, layer_id=0)
    pools = make_pools(page_size, torch.float32, 2)
    prefill(pools, [0, 1, 2, 3], [21, 5, 17, 33], layer)
    rows, prefix, extend = [4, 3, 0, 1, 2], [0, 33, 21, 5, 17], [20, 9, 1, 1, 1]
    fb = make_batch(pools, ForwardMode.MIXED, rows, prefix, extend)
    gen = torch.Generator().manual_seed(page_size)
    hq, hkv = 4 * HEAD_DIM, 2 * HEAD_DIM
    q, k, v = torch.randn(sum(extend), hq + 2 * hkv, generator=gen).split([hq, hkv, hkv], -1)
    outs = []
    for name in ("torch", "triton"):
        backend = create_attention_backend(name)
        run = dataclasses.replace(fb, attn_backend=backend)  # ForwardBatch is frozen
        backend.init_forward_metadata(run)
        outs.append(backend.forward(q, k, v, layer, run))
    atol, rtol = TOLERANCE[torch.float32]
    torch.testing.assert_close(outs[1], outs[0], atol=atol, rtol=rtol)


@pytest.fixture(scope="module")
def tiny_moe_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("triton-qwen3-moe")
    save_tiny("qwen3_moe", folder, seed=9)  # layer 0 sparse (8 experts, top-2), layer 1 dense
    return folder


class CountingOps:
    """TritonFusedOps, counting the calls each op took (did not hand back to PyTorch)."""

    def __init__(self) -> None:
        from radixserve.kernels.fused_ops import TritonFusedOps

        self.ops, self.taken = (
            TritonFusedOps(),
            dict.fromkeys(("rmsnorm", "silu_and_mul", "rotary_", "select_experts", "moe_f32"), 0),
        )

    def __getattr__(self, name: str) -> Any:
        op = getattr(self.ops, name)

        def call(*args: Any) -> Any:
            out = op(*args)
            self.taken[name] += out is not None and out is not False
            return out

        return call


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_triton_fused_ops_greedy_equals_torch(
    request: pytest.FixtureRequest, device: str, kind: str
) -> None:
    """The triton backend with the Triton RMSNorm / SiLU / rotary (and fused MoE) ops gives
    the PyTorch path's greedy tokens (torch backend, --disable-fused-ops). On the CPU the ops
    are handed over after start-up (the runner gives the CPU the C++ ops); on CUDA the runner
    attaches them itself."""
    from radixserve.engine.layers.moe import FusedMoE
    from radixserve.kernels.fused_ops import TritonFusedOps

    folder = request.getfixturevalue("tiny_folder" if kind == "llama" else "tiny_moe_folder")
    args = {"page_size": 16, "chunked_prefill_size": 16}
    expected, _ = generate(folder, "torch", device, disable_fused_ops=True, **args)
    if device == "cpu":
        ops = CountingOps()
        got, _ = generate(folder, "triton", device, ops, disable_fused_ops=True, **args)
        assert all(ops.taken[name] for name in ("rmsnorm", "silu_and_mul", "rotary_"))
        if kind != "llama":
            assert ops.taken["select_experts"] and ops.taken["moe_f32"]
    else:
        from radixserve.engine import EngineCore

        engine = EngineCore(model_path=str(folder), device=device, dtype="float32",
                            attention_backend="triton", max_total_tokens=1024)  # fmt: skip
        try:
            modules = list(engine.runner.model.modules())
            assert any(isinstance(getattr(m, "fused", None), TritonFusedOps) for m in modules)
            moes = [m for m in modules if isinstance(m, FusedMoE)]
            assert all(isinstance(m.fused, TritonFusedOps) for m in moes)
        finally:
            engine.shutdown()
        got, _ = generate(folder, "triton", device, **args)
    assert got == expected
    assert all(len(out) == NEW_TOKENS for out in got)


def test_fused_ops_are_chosen_by_device_and_backend() -> None:
    """C++ ops on the CPU, Triton ops on CUDA with triton (+ fused MoE) or flashinfer, none
    with the torch backend or --disable-fused-ops (the choice only; no device needed)."""
    from radixserve.engine.model_executor.model_runner import fused_ops_for
    from radixserve.kernels.cpu.fused_ops import CpuFusedOps
    from radixserve.kernels.fused_ops import TritonFusedOps

    cpu_ops, cpu_moe = fused_ops_for("cpu", "grouped", False)
    assert (cpu_ops is None or isinstance(cpu_ops, CpuFusedOps)) and cpu_moe is None
    ops, moe = fused_ops_for("cuda", "triton", False)
    assert isinstance(ops, TritonFusedOps) and isinstance(moe, TritonFusedOps)
    ops, moe = fused_ops_for("cuda", "flashinfer", False)
    assert isinstance(ops, TritonFusedOps) and moe is None
    assert fused_ops_for("cuda", "torch", False) == (None, None)
    assert fused_ops_for("cuda", "triton", True) == (None, None)
    assert fused_ops_for("cpu", "grouped", True) == (None, None)


SPEC = {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 4}


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_verify_extends_equal_plain_decodes(
    tiny_folder: Path, device: str, backend: str, page_size: int
) -> None:
    """Speculative verify batches (TARGET_VERIFY: each request's last token and its drafts as
    one extend, logits at every position) through the reference and the Triton backend: the
    tokens of plain decoding on the reference. The batch runs twice: the second time every
    request drafts its answer from the first run's (all accepted: chains of 3 drafts verified),
    the first time drafts come rarely and are mostly rejected."""
    from radixserve.engine import EngineCore

    prompts = [p + p[:12] for p in mixed_prompts()]
    params = {**GREEDY, "max_new_tokens": 8}
    args = {
        "model_path": str(tiny_folder), "device": device, "dtype": "float32",
        "max_total_tokens": 1024, "skip_server_warmup": True, "page_size": page_size,
    }  # fmt: skip
    plain = EngineCore(attention_backend="torch", **args)
    try:
        expected = [
            o["output_ids"] for o in plain.generate(input_ids=prompts, sampling_params=params)
        ]
    finally:
        plain.shutdown()
    spec = EngineCore(attention_backend=backend, **SPEC, **args)
    try:
        for _ in range(2):
            outs = spec.generate(input_ids=prompts, sampling_params=params)
            assert [o["output_ids"] for o in outs] == expected
        spec.scheduler.check_memory_invariant()
        stats = spec.scheduler.spec.stats
    finally:
        spec.shutdown()
    assert stats.accept_length_counts[4] >= len(prompts)
