"""ModelRunner: loads weights, sizes and owns the KV pools and the allocator, runs the forward.

One per scheduler process (rank). Under tensor parallelism it builds the model with the
rank's `ParallelGroups`, reads only its weight slices, sizes its KV pool for its own KV heads
(the token count agreed as the minimum over ranks) and makes sampled tokens identical on
every rank (broadcast from TP rank 0). The scheduler builds a ForwardBatch from its ScheduleBatch
and calls `forward`, which returns next-token logits; sampling them is the scheduler's (its
Sampler). Nothing here knows about requests or queues.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
from torch import nn

from radixserve.engine.attention import AttentionBackend, create_attention_backend
from radixserve.engine.attention.spec import AttentionSpec
from radixserve.engine.configs.model_config import ModelConfig
from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.distributed import ParallelGroups
from radixserve.engine.forward_batch import ForwardBatch
from radixserve.engine.ipc.messages import ExpertLoad
from radixserve.engine.layers.activation import SiluAndMul
from radixserve.engine.layers.expert_location import expert_location_for
from radixserve.engine.layers.layernorm import RMSNorm
from radixserve.engine.layers.logits_processor import LogitsProcessorOutput
from radixserve.engine.layers.moe import FusedMoE
from radixserve.engine.layers.parallel_linear import (
    ColumnParallelLinear,
    RowParallelLinear,
    kv_head_layout,
)
from radixserve.engine.layers.rotary_embedding import RotaryEmbedding
from radixserve.engine.layers.vocab_parallel import ParallelLMHead
from radixserve.engine.mem_cache import (
    BaseTokenAllocator,
    MHATokenToKVPool,
    MLATokenToKVPool,
    ReqToTokenPool,
    create_allocator,
)
from radixserve.engine.model_executor.cuda_graph_runner import (
    DEFAULT_MAX_BS as DEFAULT_GRAPH_MAX_BS,
)
from radixserve.engine.model_executor.cuda_graph_runner import CudaGraphRunner
from radixserve.engine.model_executor.eplb_manager import attach_expert_balancing, expert_load
from radixserve.engine.model_loader.loader import LoadedModelFiles
from radixserve.engine.models import get_model_class
from radixserve.engine.models.base import CausalLM
from radixserve.kernels.cpu.amx_gemm import AmxGemm, load_amx_gemm
from radixserve.kernels.cpu.fused_ops import load_fused_ops
from radixserve.kernels.cpu.packed_gemm import PackedWeight
from radixserve.kernels.cpu.rowwise_gemm import RowwiseGemm, load_rowwise_gemm
from radixserve.kernels.fused_ops_protocol import FusedMoeOps, FusedOps
from radixserve.logging_setup import iter_progress

logger = logging.getLogger(__name__)

CPU_DEFAULT_MEM_FRACTION = 0.2
GPU_DEFAULT_MEM_FRACTION = 0.88


@dataclass(frozen=True, slots=True)
class PoolSizes:
    max_total_tokens: int
    max_num_reqs: int
    source: str  # "max_total_tokens" or "mem_fraction_static=…"


def available_memory_bytes(device: torch.device) -> int:
    """Free device memory on GPU; MemAvailable from /proc/meminfo on CPU."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("cannot read MemAvailable from /proc/meminfo")


# Attention backends that take MLA's latent rows (values narrower than keys)
MLA_BACKENDS = ("grouped", "grouped_pytorch", "torch", "torch_native", "triton")


def kv_cell_bytes(config: ModelConfig, num_kv_heads: int | None = None) -> int:
    """Bytes one token's KV takes, all layers: K and V of `num_kv_heads` heads (default: all
    of the model's), or MLA's one latent row per layer."""
    if config.mla is not None:
        m = config.mla
        return MLATokenToKVPool.latent_cell_size_bytes(
            m.kv_lora_rank, m.qk_rope_head_dim, config.num_hidden_layers, config.dtype
        )
    heads = num_kv_heads or config.num_key_value_heads
    return MHATokenToKVPool.cell_size_bytes(
        heads, config.head_dim, config.num_hidden_layers, config.dtype
    )


def compute_pool_sizes(
    args: ServerArgs,
    config: ModelConfig,
    device: torch.device,
    num_kv_heads: int | None = None,
    extra_cell_bytes: int = 0,
) -> PoolSizes:
    """Pool sizes for `num_kv_heads` KV heads per token (default: all of the model's), and
    `extra_cell_bytes` more per token (a draft model's KV, in a pool of the same slots)."""
    cell = kv_cell_bytes(config, num_kv_heads) + extra_cell_bytes
    if args.max_total_tokens is not None:
        tokens, source = args.max_total_tokens, "max_total_tokens"
    else:
        default = CPU_DEFAULT_MEM_FRACTION if device.type == "cpu" else GPU_DEFAULT_MEM_FRACTION
        frac = args.mem_fraction_static or default
        tokens = int(available_memory_bytes(device) * frac) // cell
        source = f"mem_fraction_static={frac}"
    tokens = tokens // args.page_size * args.page_size
    if tokens < args.page_size * 2:
        raise ValueError(f"KV pool too small: {tokens} tokens ({source}); raise the memory budget")
    rows = max(min(tokens // config.context_len * 512, 4096), 2048)
    if args.max_running_requests is not None:
        rows = args.max_running_requests
    return PoolSizes(tokens, rows, source)


def fused_ops_for(
    device_type: str, backend: str, disabled: bool
) -> tuple[FusedOps | None, FusedMoeOps | None]:
    """(ops for the norm / activation / rotary modules, ops for FusedMoE): the C++ ops on the
    CPU (None where they cannot be built), the Triton ops on CUDA with the triton or
    flashinfer backend (and the Triton fused MoE with triton), none elsewhere or when
    disabled (--disable-fused-ops: PyTorch throughout)."""
    if disabled:
        return None, None
    if device_type == "cpu":
        return load_fused_ops(), None
    if device_type == "cuda" and backend in ("triton", "flashinfer"):
        from radixserve.kernels.fused_ops import TritonFusedOps

        ops = TritonFusedOps()
        return ops, ops if backend == "triton" else None
    return None, None


def attach_fused_ops(model: nn.Module, ops: FusedOps | None, moe: FusedMoeOps | None) -> None:
    """Set `fused` on every RMSNorm / SiluAndMul / RotaryEmbedding (ops) and FusedMoE (moe)
    module of model; None leaves a module as it is."""
    for module in model.modules():
        if ops is not None and isinstance(module, (RMSNorm, SiluAndMul, RotaryEmbedding)):
            module.fused = ops
        elif moe is not None and isinstance(module, FusedMoE):
            module.fused = moe


def _projection_kernels(
    args: ServerArgs,
) -> tuple[AmxGemm | None, RowwiseGemm | None, RowwiseGemm | None]:
    """(AMX kernel, row-invariant kernel for the projections, for the LM head), each None
    where not used. The row-invariant kernel takes what AMX does not wherever it builds: unlike
    oneDNN (or F.linear) it gives a token the same bits whatever its batch, so a cached prompt
    gets the same greedy answer (docs/determinism.md); with AVX512-BF16 it matched oneDNN's
    speed, and on an AVX-512 CPU without BF16 it is 1.5-2.7x faster (docs/benchmarks.md).
    `--disable-rowwise-gemm` keeps oneDNN, except for deterministic inference, which needs it.
    The LM head takes it wherever it builds (float32 logits without a float32 copy)."""
    amx = None if args.disable_amx_gemm else load_amx_gemm()
    rowwise = load_rowwise_gemm()
    if args.enable_deterministic_inference and amx is None and rowwise is None:
        raise RuntimeError(
            "enable_deterministic_inference: neither the AMX nor the row-invariant projection "
            "kernel could be built here (see the warnings above)"
        )
    keep_onednn = args.disable_rowwise_gemm and not args.enable_deterministic_inference
    projections = None if keep_onednn else rowwise
    return amx, projections, rowwise


def _require_row_invariant(model: nn.Module) -> None:
    """Deterministic inference: every projection packed (now, or by the engine whose weights
    these are: EngineCore.with_args) for a row-invariant kernel, AMX or rowwise."""
    projections = (ColumnParallelLinear, RowParallelLinear)
    layers = [m for m in model.modules() if isinstance(m, projections)]
    loose = [type(m).__name__ for m in layers if not isinstance(m.packed, PackedWeight)]
    if loose:
        raise RuntimeError(
            f"enable_deterministic_inference: {len(loose)} projection(s) ({sorted(set(loose))}) "
            "could not be packed for a row-invariant kernel (AMX or rowwise; see the warnings)"
        )


def cast_model(model: nn.Module, dtype: torch.dtype) -> None:
    """model.to(dtype), except the tensors of modules that stay float32 (`keep_float32`:
    DeepSeek's router, whose checkpoint weights are float32)."""
    for module in model.modules():
        if getattr(module, "keep_float32", False):
            continue
        for p in module.parameters(recurse=False):
            if p.is_floating_point():
                p.data = p.data.to(dtype)
        for name, buf in module.named_buffers(recurse=False):
            if buf.is_floating_point():
                setattr(module, name, buf.to(dtype))


class ModelRunner:
    """`draft_cell_bytes`: a draft model's KV per token, sized into the pool's budget.
    `slots_of`: the target runner a draft runner shares its request rows, allocator and pool
    size with (its own KV buffers and attention backend: the same slot holds the target's KV
    in one pool and the draft's in the other)."""

    sizes: PoolSizes
    req_to_token_pool: ReqToTokenPool
    allocator: BaseTokenAllocator

    def __init__(  # noqa: PLR0913 - the draft's two ties to its target
        self,
        args: ServerArgs,
        files: LoadedModelFiles,
        model: CausalLM | None = None,
        groups: ParallelGroups | None = None,
        draft_cell_bytes: int = 0,
        slots_of: ModelRunner | None = None,
    ) -> None:
        self.args = args
        self.model_config = files.config
        self.device = torch.device(args.device)
        self.groups = groups or ParallelGroups.single(self.device)
        moe_ep = files.config.moe is not None and self.groups.ep.size > 1
        self.expert_location = (
            expert_location_for(args, files.config, self.groups.ep.size) if moe_ep else None
        )
        self.model = model if model is not None else self._load_model(files)
        self.expert_recorder, self.eplb = attach_expert_balancing(
            self.model, args, files.config, self.expert_location, self.groups.ep
        )
        self._attach_fused_ops()
        self._prepack_cpu_weights()
        c = self.model_config
        self.num_local_kv_heads = (
            1  # MLA: one latent row per token, read by every head
            if c.mla is not None
            else kv_head_layout(c.num_key_value_heads, self.groups.attn_tp).num_local_heads
        )
        if slots_of is not None:
            self.sizes = slots_of.sizes
            self.req_to_token_pool = slots_of.req_to_token_pool
            self.allocator = slots_of.allocator
        else:
            self.sizes = self._pool_sizes(draft_cell_bytes)
            self.req_to_token_pool = ReqToTokenPool(
                self.sizes.max_num_reqs, c.context_len + 4, self.device
            )
            self.allocator = create_allocator(
                self.sizes.max_total_tokens, args.page_size, self.device
            )
        self.token_to_kv_pool = self._create_pool()
        # EAGLE's target: every token's final hidden state, by KV slot (the draft head's input)
        self.hidden_pool = self._create_hidden_pool() if slots_of is None else None
        self.attn_backend = self._create_backend()
        self.graph_runner = self._maybe_capture_graphs()
        logger.info(
            "kv_pool max_total_tokens=%d page_size=%d max_num_reqs=%d dtype=%s source=%s",
            self.sizes.max_total_tokens,
            args.page_size,
            self.sizes.max_num_reqs,
            c.dtype,
            self.sizes.source,
        )

    def _pool_sizes(self, draft_cell_bytes: int) -> PoolSizes:
        c = self.model_config
        sizes = compute_pool_sizes(
            self.args, c, self.device, self.num_local_kv_heads, draft_cell_bytes
        )
        # Every rank schedules the same batches: all must hold the same number of tokens.
        tokens = self.groups.cpu.min_int(sizes.max_total_tokens)
        rows = self.groups.cpu.min_int(sizes.max_num_reqs)
        return PoolSizes(tokens, rows, sizes.source)

    @property
    def kv_cell_bytes(self) -> int:
        """This rank's KV bytes per token (all layers)."""
        return kv_cell_bytes(self.model_config, self.num_local_kv_heads)

    def _create_hidden_pool(self) -> torch.Tensor | None:
        if self.args.speculative_algorithm != "EAGLE":
            return None
        processor = getattr(self.model, "logits_processor", None)
        if processor is None:
            name = type(self.model).__name__
            raise ValueError(f"speculative_algorithm: EAGLE needs {name}'s hidden states")
        processor.capture_hidden = True
        c, rows = self.model_config, self.sizes.max_total_tokens + self.args.page_size
        return torch.zeros(rows, c.hidden_size, dtype=c.dtype, device=self.device)

    def _create_pool(self) -> MHATokenToKVPool:
        c, size, page = self.model_config, self.sizes.max_total_tokens, self.args.page_size
        if c.mla is not None:
            m = c.mla
            return MLATokenToKVPool(
                size, page, c.dtype, m.kv_lora_rank, m.qk_rope_head_dim, c.num_hidden_layers,
                self.device,
            )  # fmt: skip
        return MHATokenToKVPool(
            size, page, c.dtype, self.num_local_kv_heads, c.head_dim, c.num_hidden_layers,
            self.device,
        )  # fmt: skip

    def _attach_fused_ops(self) -> None:
        """Hand every norm, activation and rotary module (and FusedMoE) the fused ops of its
        device (`fused_ops_for`); each module falls back to its PyTorch code for tensors an op
        does not take."""
        backend = self.args.resolved_attention_backend
        ops, moe = fused_ops_for(self.device.type, backend, self.args.disable_fused_ops)
        attach_fused_ops(self.model, ops, moe)
        logger.info("fused_ops=%s fused_moe=%s", type(ops).__name__, type(moe).__name__)

    def _prepack_cpu_weights(self) -> None:
        """CPU bfloat16: every projection's weight packed once, for the AMX kernel where it
        runs, else for the row-invariant kernel (`_projection_kernels`), else for oneDNN
        (parallel_linear); the LM head for either kernel (float32 logits, vocab_parallel)."""
        if self.device.type != "cpu" or self.args.disable_weight_prepack:
            return
        deterministic = self.args.enable_deterministic_inference
        if deterministic and self.model_config.moe is not None:
            raise RuntimeError("enable_deterministic_inference: MoE models are not covered yet")
        amx, rowwise, head_rowwise = _projection_kernels(self.args)
        layouts: list[str | None] = []
        heads: list[str | None] = []
        for m in self.model.modules():
            if isinstance(m, (ColumnParallelLinear, RowParallelLinear)):
                layouts.append(m.prepack_cpu(amx, rowwise))
            elif isinstance(m, ParallelLMHead):
                heads.append(m.prepack_cpu(amx, head_rowwise))
        if deterministic:
            _require_row_invariant(self.model)
        if any(layouts) or any(heads):
            logger.info(
                "weight_prepack: %d of %d projections (amx %d, rowwise %d, onednn %d), "
                "lm_head %s",
                sum(x is not None for x in layouts), len(layouts), layouts.count("amx"),
                layouts.count("rowwise"), layouts.count("onednn"), heads,
            )  # fmt: skip

    def _create_backend(self) -> AttentionBackend:
        c, name = self.model_config, self.args.resolved_attention_backend
        heads = c.num_attention_heads // self.groups.attn_tp.size
        head_dim, v_head_dim = c.head_dim, c.head_dim
        if c.mla is not None:
            if name not in MLA_BACKENDS:
                raise ValueError(
                    f"attention_backend={name}: {c.architecture} (MLA) runs on "
                    f"{', '.join(MLA_BACKENDS)}"
                )
            head_dim, v_head_dim = c.mla.latent_dim, c.mla.kv_lora_rank
        spec = AttentionSpec(
            heads, self.num_local_kv_heads, head_dim, c.dtype, self.device,
            self.sizes.max_num_reqs, c.context_len + 4, self.args.page_size,
            self.args.enable_deterministic_inference, not self.args.disable_tiled_extend,
            v_head_dim,
        )  # fmt: skip
        logger.info("attention_backend=%s (requested %s)", name, self.args.attention_backend)
        return create_attention_backend(name, spec)

    def _maybe_capture_graphs(self) -> CudaGraphRunner | None:
        """Decode CUDA graphs where they are supported (see cuda_graph_runner.py), else None
        with the reason logged."""
        from radixserve.engine.attention.triton_backend import TritonAttnBackend

        args, backend = self.args, self.attn_backend
        if self.device.type != "cuda" or args.disable_cuda_graph:
            return None
        if self.hidden_pool is not None:
            logger.info("cuda_graph off: EAGLE's hidden states are not captured in graphs yet")
            return None
        if not isinstance(backend, TritonAttnBackend):
            why = f"attention_backend={args.resolved_attention_backend} (graphs: triton only)"
        elif self.groups.world.size > 1 or args.enable_dp_attention:
            why = "more than one process (TP / DP attention decode is not captured yet)"
        else:
            max_bs = min(args.cuda_graph_max_bs or DEFAULT_GRAPH_MAX_BS, self.sizes.max_num_reqs)
            return CudaGraphRunner(
                self.model, backend, self.req_to_token_pool, self.token_to_kv_pool,
                max_bs, self.device,
            )  # fmt: skip
        logger.info("cuda_graph off: %s", why)
        return None

    def _load_model(self, files: LoadedModelFiles) -> CausalLM:
        start = time.perf_counter()
        cls = get_model_class(files.config.architecture)
        tp = self.groups.world.size > 1
        with torch.device(self.device):
            # Single process: the constructor every architecture has (config only).
            placed = {"expert_location": self.expert_location} if self.expert_location else {}
            model = cls(files.config, groups=self.groups, **placed) if tp else cls(files.config)
        weights = files.sharded_weights() if tp else files.weights()
        if self.groups.world.rank == 0:  # one bar per replica
            weights = iter_progress(weights, "loading weights", "tensor")
        model.load_weights(weights)
        cast_model(model, files.config.dtype)
        # Rotary tables stay float32 whatever the model dtype: they are cast per use.
        for name, buf in model.named_buffers():
            if "cos_cached" in name or "sin_cached" in name:
                buf.data = buf.data.float()
        model.eval()
        logger.info(
            "model_loaded arch=%s dtype=%s seconds=%.1f",
            files.config.architecture,
            files.config.dtype,
            time.perf_counter() - start,
        )
        return model

    def expert_load(self) -> ExpertLoad | None:
        """The experts' balance over the EP ranks, for the load snapshot (None: no recorder)."""
        return expert_load(self.expert_recorder, self.eplb, self.groups.ep.size)

    def release_pools(self) -> None:
        """Free the KV buffers now rather than whenever the runner is collected (and the
        decode graphs, which hold their addresses and their own memory pool)."""
        self.graph_runner = None
        self.hidden_pool = None
        self.token_to_kv_pool.k_buffer.clear()
        self.token_to_kv_pool.v_buffer.clear()

    def sync_sampled(self, next_token_ids: torch.Tensor) -> torch.Tensor:
        """[B] sampled ids → attention-TP rank 0's ids on every rank of this DP rank (in
        place): ranks that schedule together must agree on every token or drift apart."""
        return self.groups.attn_tp.broadcast(next_token_ids)

    def forward(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        if self.graph_runner is not None and self.graph_runner.can_run(forward_batch):
            return self.graph_runner.replay(forward_batch)
        if not forward_batch.forward_mode.is_idle():
            self.attn_backend.init_forward_metadata(forward_batch)
        with torch.inference_mode():
            out: LogitsProcessorOutput = self.model(
                forward_batch.input_ids, forward_batch.positions, forward_batch
            )
        if self.hidden_pool is not None and out.hidden_states is not None:
            self.hidden_pool[forward_batch.out_cache_loc] = out.hidden_states.to(
                self.hidden_pool.dtype
            )
        if self.expert_recorder is not None:
            self.expert_recorder.end_pass()
        if self.eplb is not None:  # between two forwards: experts may move now
            self.eplb.on_forward_end()
        return out
