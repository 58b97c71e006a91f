"""ServerArgs: the one frozen configuration object of an engine replica.

Built once (from keyword arguments or the CLI), validated at construction with errors that
name the field, then passed down; lower layers receive only the slices they need.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radixserve.engine.configs.cpu_features import check_cpu_bind, cpu_has_bf16
from radixserve.logging_setup import LOG_FORMATS
from radixserve.protocol.kv_events import parse_event_format

if TYPE_CHECKING:  # model_config imports torch: the router's CLI parses engine flags too
    from radixserve.engine.configs.model_config import ModelConfig

POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random")
DTYPES = ("float32", "bfloat16", "float16", "auto")
EVICTION_POLICIES = ("lru", "lfu", "fifo")
# CPU chunked prefill: about 128 tokens per core of a rank (256 on 2 cores, at most 2048), so a
# chunk takes ~0.2 s: requests queued together get their first tokens group by group instead
# of all after one long forward (mean TTFT), and running decodes wait at most one chunk.
CPU_PREFILL_TOKENS_PER_CORE = 128
CPU_CHUNKED_PREFILL_BOUNDS = (256, 2048)
A2A_BACKENDS = ("none", "all_to_all")  # --moe-a2a-backend (layers.moe.ep_moe_forward)
LOAD_BALANCE_METHODS = ("round_robin", "shortest_queue")  # managers.data_parallel_controller


@dataclass(frozen=True, slots=True)
class ServerArgs:
    model_path: str = "smollm2-135m"
    revision: str | None = None  # branch, tag or commit when model_path is a Hub repo id
    served_model_name: str | None = None
    dtype: str = "auto"  # auto: bfloat16 on GPUs and on CPUs with AVX-512 BF16 / AMX
    device: str = "cpu"
    random_seed: int = 0
    # KV memory
    page_size: int = 1
    max_total_tokens: int | None = None
    mem_fraction_static: float | None = None  # None: 0.88 on GPU, 0.2 of free RAM on CPU
    max_running_requests: int | None = None
    # scheduling
    # None: on CPU 128 tokens per core of a rank within [256, 2048], off elsewhere; -1: off
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = 16384
    schedule_policy: str = "lpm"  # cache-aware: longest cached prefix first
    schedule_conservativeness: float = 1.0
    enable_mixed_chunk: bool = False
    max_queued_requests: int | None = None
    disable_radix_cache: bool = False
    radix_eviction_policy: str = "lru"
    # Pin the cached prefix of waiting requests, up to this fraction of the pool (0: off;
    # measured within the run-to-run noise under eviction, docs/benchmarks.md)
    waiting_prefix_pin_fraction: float = 0.0
    disable_overlap_schedule: bool | None = None  # None: off on CPU, where it costs
    # Record radix-tree events; only the scheduler process's publisher (--kv-events-port) drains
    # them, so enabling them without a port is refused (they would grow without bound).
    enable_kv_events: bool = False
    # auto: grouped on CPU; on CUDA flashinfer if installed, else triton; torch elsewhere
    attention_backend: str = "auto"
    # CUDA graphs for decode batches of up to cuda_graph_max_bs requests (None: 160, capped by
    # the pool's rows); captured at start-up (model_executor/cuda_graph_runner.py)
    cuda_graph_max_bs: int | None = None
    disable_cuda_graph: bool = False
    # fused RMSNorm / SiLU-and-mul / rotary ops in place of their PyTorch chains: C++ on the
    # CPU (kernels/cpu/fused_ops.cpp), Triton on CUDA with the triton or flashinfer backend
    # (kernels/fused_ops.py; plus the fused MoE with triton); on keeps PyTorch (the oracle)
    disable_fused_ops: bool = False
    # CPU bfloat16: projection weights packed once at load (layers/parallel_linear.py) for our
    # AMX kernel where the CPU has AMX-BF16, else for oneDNN; off keeps plain weights and
    # F.linear (the A/B). disable_amx_gemm packs for oneDNN even with AMX (the A/B of the kernel)
    disable_weight_prepack: bool = False
    disable_amx_gemm: bool = False
    # Where AMX does not run, CPUs with AVX512-BF16 pack for our row-invariant kernel
    # (kernels/cpu/rowwise_gemm.cpp: a token's projection is the same bits in any batch, and
    # it matched oneDNN's speed); this flag keeps oneDNN there (the A/B)
    disable_rowwise_gemm: bool = False
    # Greedy output that does not depend on the batch a request ran in, on a cache hit or on
    # chunking (SGLang's flag): every projection through a row-invariant kernel (AMX, else
    # kernels/cpu/rowwise_gemm.cpp, never oneDNN) and every query token's attention through
    # the paged kernel's one path (CPU, grouped backend). docs/determinism.md: what it costs
    enable_deterministic_inference: bool = False
    # CPU: leave the torch threads to the OS (none), or pin each scheduler process's threads
    # to its share of the allowed CPUs (auto) or to per-process groups "0-3|4-7"
    # (scheduler/cpu_binding.py; none is the default: measured no faster in serving here)
    cpu_bind: str = "none"
    # parallelism: one scheduler process per rank. Without DP attention dp_size independent
    # scheduling groups of tp_size ranks each; with it tp_size ranks in all, whose attention is
    # split into dp_size DP ranks of tp_size / dp_size ranks (SGLang's convention)
    tp_size: int = 1
    dp_size: int = 1
    ep_size: int = 1
    moe_a2a_backend: str = "none"  # EP dispatch: none (all-reduce) | all_to_all
    load_balance_method: str = "round_robin"  # DP controller: round_robin | shortest_queue
    enable_dp_attention: bool = False
    # serving
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = field(default=None, repr=False)  # or $RADIXSERVE_API_KEY; never logged
    kv_events_port: int | None = None  # publish KV events on tcp://host:port (+1: replay)
    kv_events_format: str = "map"  # map: SGLang 0.5.23 / vLLM 0.32 consumers; array: SGLang 0.5.6
    skip_server_warmup: bool = False
    # abuse limits (None: $RADIXSERVE_MAX_REQUEST_BODY_BYTES / $RADIXSERVE_HEADER_TIMEOUT_S, else
    # 32 MiB / 30 s): a larger body is a 413; a connection whose headers take longer is closed
    max_request_body_bytes: int | None = None
    header_timeout_s: float | None = None
    log_level: str = "warning"
    log_format: str = "text"  # text | json (one JSON object per line)
    log_requests: bool = False  # one INFO line per finished request (ids, tokens, latencies)
    log_requests_text: bool = False  # ... with the prompt and output text (off: no user text)
    # sampling defaults for unset request fields: auto (the model's generation_config.json),
    # vllm (none: the engine's own), or a path (model_loader.generation_defaults)
    generation_config: str = "auto"

    def __post_init__(self) -> None:
        _check(self.dtype in DTYPES, "dtype", f"must be one of {DTYPES}, got {self.dtype!r}")
        _check(self.page_size >= 1, "page_size", f"must be ≥ 1, got {self.page_size}")
        check_cpu_bind(self.cpu_bind)
        for name in ("max_request_body_bytes", "header_timeout_s"):
            value = getattr(self, name)
            _check(value is None or value > 0, name, f"must be > 0, got {value}")
        _check(
            self.max_total_tokens is None or self.max_total_tokens > 0,
            "max_total_tokens",
            f"must be > 0, got {self.max_total_tokens}",
        )
        _check(
            self.mem_fraction_static is None or 0 < self.mem_fraction_static < 1,
            "mem_fraction_static",
            f"must be in (0, 1), got {self.mem_fraction_static}",
        )
        _check(
            self.max_running_requests is None or self.max_running_requests >= 1,
            "max_running_requests",
            f"must be ≥ 1, got {self.max_running_requests}",
        )
        _check(
            self.max_prefill_tokens >= 1,
            "max_prefill_tokens",
            f"must be ≥ 1, got {self.max_prefill_tokens}",
        )
        _check(
            self.schedule_policy in POLICIES,
            "schedule_policy",
            f"must be one of {POLICIES}, got {self.schedule_policy!r}",
        )
        _check(
            self.schedule_conservativeness > 0,
            "schedule_conservativeness",
            f"must be > 0, got {self.schedule_conservativeness}",
        )
        _check(
            self.max_queued_requests is None or self.max_queued_requests >= 1,
            "max_queued_requests",
            f"must be ≥ 1, got {self.max_queued_requests}",
        )
        _check(
            0.0 <= self.waiting_prefix_pin_fraction <= 1.0,
            "waiting_prefix_pin_fraction",
            f"must be in [0, 1], got {self.waiting_prefix_pin_fraction}",
        )
        _check(
            self.radix_eviction_policy in EVICTION_POLICIES,
            "radix_eviction_policy",
            f"must be one of {EVICTION_POLICIES}, got {self.radix_eviction_policy!r}",
        )
        _check(
            not self.enable_kv_events or self.kv_events_port is not None,
            "enable_kv_events",
            "--enable-kv-events needs --kv-events-port: the publisher on that port is what "
            "drains the recorded events, which would otherwise grow without bound",
        )
        parse_event_format(self.kv_events_format, "kv_events_format")
        _check(self.log_format in LOG_FORMATS, "log_format", f"must be one of {LOG_FORMATS}")
        _check(
            self.generation_config in ("auto", "vllm") or Path(self.generation_config).exists(),
            "generation_config",
            f"must be auto, vllm or an existing path, got {self.generation_config!r}",
        )
        self._check_parallelism()
        chunk = self.chunked_prefill_size
        _check(
            chunk is None or chunk == -1 or chunk >= self.page_size,
            "chunked_prefill_size",
            f"must be -1 (off) or ≥ page_size, got {chunk}",
        )
        graph_bs = self.cuda_graph_max_bs
        _check(
            graph_bs is None or graph_bs >= 1, "cuda_graph_max_bs", f"must be ≥ 1, got {graph_bs}"
        )
        self._check_deterministic()

    def _check_deterministic(self) -> None:
        """Deterministic inference exists for the CPU's grouped backend in bfloat16 or
        float32, with the packed (row-invariant) projections; refuse what it does not cover
        rather than serve answers that only look deterministic."""
        if not self.enable_deterministic_inference:
            return
        name = "enable_deterministic_inference"
        _check(self.device == "cpu", name, f"runs on the CPU only for now, not {self.device}")
        _check(
            self.resolved_attention_backend == "grouped",
            name,
            f"needs --attention-backend grouped, got {self.attention_backend!r}",
        )
        _check(
            not (self.disable_weight_prepack or self.disable_rowwise_gemm),
            name,
            "needs the packed row-invariant projections (drop --disable-weight-prepack and "
            "--disable-rowwise-gemm)",
        )
        _check(self.tp_size == 1 and self.ep_size == 1, name, "runs with tp_size = ep_size = 1")
        _check(
            self.resolved_dtype == "bfloat16",
            name,
            f"runs in bfloat16 (the packed kernels' dtype), got {self.resolved_dtype}",
        )

    def _check_parallelism(self) -> None:
        for name in ("tp_size", "dp_size", "ep_size"):
            value = getattr(self, name)
            _check(value >= 1, name, f"must be ≥ 1, got {value}")
        if self.enable_dp_attention:
            _check(
                self.tp_size % self.dp_size == 0,
                "dp_size",
                f"must divide tp_size ({self.tp_size}) with --enable-dp-attention",
            )
            _check(
                self.dp_size > 1,
                "enable_dp_attention",
                "needs --dp-size > 1 (the number of DP attention ranks)",
            )
        _check(
            self.ep_size <= self.tp_size * self.dp_size,
            "ep_size",
            f"must be ≤ tp_size × dp_size, got {self.ep_size}",
        )
        _check(
            self.tp_size % self.ep_size == 0,
            "ep_size",
            f"must divide tp_size ({self.tp_size}): each EP group is ep_size TP ranks, "
            f"got {self.ep_size}",
        )
        _check(
            self.moe_a2a_backend in A2A_BACKENDS,
            "moe_a2a_backend",
            f"must be one of {A2A_BACKENDS}, got {self.moe_a2a_backend!r}",
        )
        _check(
            self.load_balance_method in LOAD_BALANCE_METHODS,
            "load_balance_method",
            f"must be one of {LOAD_BALANCE_METHODS}, got {self.load_balance_method!r}",
        )

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path

    @property
    def chunk_size(self) -> int | None:
        """Chunked prefill budget in tokens, or None when chunking is off."""
        if self.chunked_prefill_size is None:
            return self._cpu_chunk_default() if self.device == "cpu" else None
        if self.chunked_prefill_size == -1:
            return None
        return self.chunked_prefill_size

    def _cpu_chunk_default(self) -> int:
        low, high = CPU_CHUNKED_PREFILL_BOUNDS
        return max(low, min(high, CPU_PREFILL_TOKENS_PER_CORE * self.cpu_threads_per_rank))

    @property
    def cpu_threads_per_rank(self) -> int:
        """Torch threads of each scheduler process on a CPU: its share of the usable cores."""
        return max(1, len(os.sched_getaffinity(0)) // self.num_ranks)

    @property
    def num_ranks(self) -> int:
        """Scheduler processes of this server (one per rank)."""
        return self.tp_size if self.enable_dp_attention else self.tp_size * self.dp_size

    @property
    def attn_tp_size(self) -> int:
        """Ranks that share one attention (and one scheduler's batches): tp / dp under DP
        attention, tp otherwise."""
        return self.tp_size // self.dp_size if self.enable_dp_attention else self.tp_size

    @property
    def overlap_schedule(self) -> bool:
        """Whether the overlapped event loop runs (default: everywhere but on CPU, where the
        forward thread and the scheduler compete for the same few cores). DP attention runs
        without it: each step's token counts are agreed before its forward."""
        if self.enable_dp_attention:
            return False
        if self.disable_overlap_schedule is None:
            return self.device != "cpu"
        return not self.disable_overlap_schedule

    @property
    def resolved_dtype(self) -> str:
        if self.dtype != "auto":
            return self.dtype
        if self.device != "cpu":
            return "bfloat16"
        return "bfloat16" if cpu_has_bf16() else "float32"

    @property
    def resolved_attention_backend(self) -> str:
        """'auto' → the grouped backend on CPU; on CUDA the fastest installed: flashinfer if
        it can be imported, else triton; the reference (torch) on any other device."""
        if self.attention_backend != "auto":
            return self.attention_backend
        if self.device == "cpu":
            return "grouped"
        if self.device.startswith("cuda"):
            import importlib.util

            return "flashinfer" if importlib.util.find_spec("flashinfer") else "triton"
        return "torch"

    def effective_settings(self) -> str:
        """One line of the settings that defaults resolve per device, for the start-up log."""
        return (
            f"device={self.device} dtype={self.resolved_dtype} "
            f"attention_backend={self.resolved_attention_backend} "
            f"schedule_policy={self.schedule_policy} chunked_prefill_size={self.chunk_size} "
            f"overlap_schedule={self.overlap_schedule} page_size={self.page_size} "
            f"deterministic={self.enable_deterministic_inference}"
            + (
                f" cpu_bind={self.cpu_bind}"
                if self.device == "cpu"
                else f" disable_cuda_graph={self.disable_cuda_graph}"
            )
        )

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> ServerArgs:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown engine argument(s): {unknown}")
        return cls(**kwargs)


def check_tp_layout(config: ModelConfig, tp_size: int, dp_attention: bool = False) -> None:
    """Refuse a TP size the model's heads cannot be split over (ValueError naming tp_size):
    attention heads must divide evenly; KV heads must divide evenly, or divide tp_size (then
    each KV head is replicated on tp_size / num_kv_heads ranks). Under DP attention the heads
    are split over the attention-TP size (`ServerArgs.attn_tp_size`), which is what is passed."""
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    split = (
        f"tp_size / dp_size = {tp_size} (DP attention)" if dp_attention else f"tp_size {tp_size}"
    )
    _check(
        heads % tp_size == 0,
        "tp_size",
        f"the model's {heads} attention heads are not divisible by {split}",
    )
    ok = kv % tp_size == 0 if kv >= tp_size else tp_size % kv == 0
    _check(
        ok,
        "tp_size",
        f"the model's {kv} KV heads can be neither split nor replicated over {split} "
        "(one must divide the other)",
    )


def check_mlp_layout(config: ModelConfig, tp_size: int) -> None:
    """Under DP attention the MLPs span the whole TP group: their intermediate sizes must split
    evenly over it (ValueError naming tp_size)."""
    sizes = [config.intermediate_size]
    if config.moe is not None:
        sizes.append(config.moe.shared_expert_intermediate_size or 0)
    for size in sizes:
        _check(
            size % tp_size == 0,
            "tp_size",
            f"the model's MLP intermediate size {size} is not divisible by tp_size {tp_size}",
        )


def check_ep_layout(config: ModelConfig, ep_size: int) -> None:
    """Refuse an EP size the model's experts cannot be split over (ValueError naming ep_size)."""
    if ep_size == 1:
        return
    _check(config.moe is not None, "ep_size", f"{ep_size} needs a MoE model; this one is dense")
    experts = config.moe.num_experts if config.moe is not None else 0
    _check(
        experts % ep_size == 0,
        "ep_size",
        f"the model's {experts} experts are not divisible by ep_size {ep_size}",
    )


def check_devices(args: ServerArgs, num_cuda_devices: int) -> None:
    """On CUDA each rank needs its own device (ValueError naming tp_size)."""
    if args.device.startswith("cuda"):
        _check(
            args.num_ranks <= num_cuda_devices,
            "tp_size",
            f"{args.num_ranks} ranks need {args.num_ranks} CUDA devices, "
            f"{num_cuda_devices} visible",
        )


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{name}: {message}")
