"""CudaGraphRunner: decode forwards replayed from CUDA graphs captured at start-up.

A decode step of a small batch is launch-bound: hundreds of small kernels per step, each a few
microseconds of CPU launch for microseconds of GPU work. Capturing the whole model forward once
per batch size and replaying it removes the launches. As in SGLang, graphs are captured for a
list of batch sizes up to `cuda_graph_max_bs`; a decode of B requests is copied into static
input buffers, padded to the smallest captured size >= B, and replayed. Padding rows decode
token 0 at position 0 with one cached token at the reserved slot 0 and write their K/V there,
so they touch no request's KV. The attention backend plans into static buffers it allocated
for graphs (`init_cuda_graph_state` / `init_forward_metadata_replay`).

Scope: plain DECODE on one process (world size 1) with the triton backend. EXTEND/MIXED run
eagerly; so does everything under tensor parallelism or DP attention (IDLE forwards, the
per-step token exchange and the gathers are not captured yet), and the flashinfer and torch
backends (their planning reads host lengths). `ModelRunner` decides and logs which.
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass

import torch

from radixserve.engine.attention.triton_backend import TritonAttnBackend
from radixserve.engine.forward_batch import ForwardBatch, ForwardMode
from radixserve.engine.layers.logits_processor import LogitsProcessorOutput
from radixserve.engine.mem_cache import MHATokenToKVPool, ReqToTokenPool
from radixserve.engine.models.base import CausalLM

logger = logging.getLogger(__name__)

DEFAULT_MAX_BS = 160  # SGLang's default for large-memory GPUs
PADDING_SLOT = 0  # the pool's reserved slot: padding rows read and write only it


def capture_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to max_bs (and max_bs itself), like SGLang's
    list: small sizes exact, larger ones at most 7 padding rows."""
    sizes = {s for s in (1, 2, 4) if s <= max_bs}
    sizes.update(range(8, max_bs + 1, 8))
    sizes.add(max_bs)
    return sorted(sizes)


@dataclass(frozen=True, slots=True)
class GraphInputs:
    """The static buffers every captured graph reads (views of the first bs rows)."""

    input_ids: torch.Tensor  # [max_bs] int64
    positions: torch.Tensor  # [max_bs] int64
    out_cache_loc: torch.Tensor  # [max_bs] int64
    seq_lens: torch.Tensor  # [max_bs] int64
    req_pool_indices: torch.Tensor  # [max_bs] int64

    @staticmethod
    def allocate(max_bs: int, device: torch.device) -> GraphInputs:
        def z() -> torch.Tensor:
            return torch.zeros(max_bs, dtype=torch.int64, device=device)

        return GraphInputs(z(), z(), z(), torch.ones(max_bs, dtype=torch.int64, device=device), z())


class CudaGraphRunner:
    def __init__(  # noqa: PLR0913 -- the pieces of a ModelRunner a replay reads
        self,
        model: CausalLM,
        backend: TritonAttnBackend,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool: MHATokenToKVPool,
        max_bs: int,
        device: torch.device,
        capture: bool = True,
    ) -> None:
        """capture=False keeps the static buffers, padding and planning but runs the model
        eagerly on the padded static batch at each "replay": the captured computation without
        a graph (the CPU test of this bookkeeping; a way to tell graph bugs from the rest)."""
        self.model = model
        self.backend = backend
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = token_to_kv_pool
        self.sizes = capture_batch_sizes(max_bs)
        self.max_bs = self.sizes[-1]
        self.inputs = GraphInputs.allocate(self.max_bs, device)
        width = int(req_to_token_pool.req_to_token.shape[1])
        backend.init_cuda_graph_state(self.max_bs, width, device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self._empty_rows = torch.zeros(0, 0, dtype=torch.int64, device=device)
        if capture:
            self.capture()

    def _static_batch(self, bs: int) -> ForwardBatch:
        s = self.inputs
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=s.input_ids[:bs],
            positions=s.positions[:bs],
            req_pool_indices=s.req_pool_indices[:bs],
            seq_lens=s.seq_lens[:bs],
            out_cache_loc=s.out_cache_loc[:bs],
            # host lists are not read by a captured decode (the triton backend plans from the
            # device tensors); they describe the padding batch
            extend_prefix_lens_cpu=[0] * bs,
            extend_seq_lens_cpu=[1] * bs,
            seq_lens_cpu=[1] * bs,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.token_to_kv_pool,
            attn_backend=self.backend,
            kv_rows=self._empty_rows,
        )

    def capture(self) -> None:
        start = time.perf_counter()
        pool = None
        # Largest first, so the smaller graphs reuse the largest one's memory pool.
        for bs in reversed(self.sizes):
            fb = self._static_batch(bs)
            self.backend.init_forward_metadata_replay(fb, bs, self.inputs.seq_lens[:bs])
            with torch.inference_mode():
                for _ in range(2):  # compile the Triton kernels and warm the allocator
                    self.model(fb.input_ids, fb.positions, fb)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    out = self.model(fb.input_ids, fb.positions, fb)
            pool = graph.pool()
            self.graphs[bs] = graph
            self.outputs[bs] = out.next_token_logits
        torch.cuda.synchronize()
        logger.info(
            "cuda_graph captured batch_sizes=%s seconds=%.1f",
            self.sizes,
            time.perf_counter() - start,
        )

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        fb = forward_batch
        return fb.forward_mode.is_decode() and fb.batch_size <= self.max_bs and fb.dp_meta is None

    def replay(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        fb, s = forward_batch, self.inputs
        raw = fb.batch_size
        bs = self.sizes[bisect.bisect_left(self.sizes, raw)]
        s.input_ids[:raw].copy_(fb.input_ids)
        s.positions[:raw].copy_(fb.positions)
        s.out_cache_loc[:raw].copy_(fb.out_cache_loc)
        s.seq_lens[:raw].copy_(fb.seq_lens)
        s.req_pool_indices[:raw].copy_(fb.req_pool_indices)
        if bs > raw:  # padding rows: token 0 at position 0, one token at the reserved slot
            for buf in (s.input_ids, s.positions, s.req_pool_indices):
                buf[raw:bs].zero_()
            s.out_cache_loc[raw:bs].fill_(PADDING_SLOT)
            s.seq_lens[raw:bs].fill_(1)
        self.backend.init_forward_metadata_replay(fb, bs, s.seq_lens[:bs])
        graph = self.graphs.get(bs)
        if graph is None:  # capture=False: the same padded batch, run eagerly
            static = self._static_batch(bs)
            with torch.inference_mode():
                out = self.model(static.input_ids, static.positions, static)
            return LogitsProcessorOutput(out.next_token_logits[:raw])
        graph.replay()
        # A view of the graph's output: consumed (sampled) on this stream before the next replay.
        return LogitsProcessorOutput(self.outputs[bs][:raw])
