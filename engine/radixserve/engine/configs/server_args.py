"""ServerArgs: the one frozen configuration object of an engine replica.

Built once (from keyword arguments or the CLI), validated at construction with errors that
name the field, then passed down; lower layers receive only the slices they need.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from radixserve.config_options import check_choices, option
from radixserve.engine.configs.cpu_features import (
    cgroup_cpu_limit,
    check_cpu_bind,
    cpu_has_bf16,
    omp_num_threads,
    usable_cpus,
)
from radixserve.engine.configs.model_checks import check_flag as _check
from radixserve.engine.configs.speculative_args import (
    NGRAM_DRAFT_TOKENS,
    SPECULATIVE_ALGORITHMS,
    STANDALONE_STEPS,
    check_speculative,
    draft_tokens,
)
from radixserve.logging_setup import LOG_FORMATS, LOG_LEVELS
from radixserve.protocol.kv_events import EVENT_FORMATS

SCHEDULE_POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random")  # scheduler.schedule_policy
DTYPES = ("float32", "bfloat16", "float16", "auto")
EVICTION_POLICIES = ("lru", "lfu", "fifo")
# CPU chunked prefill: about 128 tokens per core of a rank (256 on 2 cores, at most 2048), so a
# chunk takes ~0.2 s: requests queued together get their first tokens group by group instead
# of all after one long forward (mean TTFT), and running decodes wait at most one chunk.
CPU_PREFILL_TOKENS_PER_CORE = 128
CPU_CHUNKED_PREFILL_BOUNDS = (256, 2048)
A2A_BACKENDS = ("none", "all_to_all")  # --moe-a2a-backend (layers.moe.ep_moe_forward)
LOAD_BALANCE_METHODS = ("round_robin", "shortest_queue")  # tokenizer.data_parallel_controller
DISAGGREGATION_MODES = ("null", "prefill", "decode")  # SGLang's --disaggregation-mode
TRANSFER_BACKENDS = ("mooncake", "nixl", "fake")  # disaggregation.transfer
GRAMMAR_BACKENDS = ("xgrammar", "none")
EXPERT_RECORDER_MODES = ("stat",)  # --expert-distribution-recorder-mode (SGLang's stat mode)
# HiCache (mem_cache/hiradix_cache.py, docs/hicache.md): SGLang's flag names and choices
HICACHE_WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
HICACHE_STORAGE_BACKENDS = ("file", "mooncake")
HICACHE_PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
# --hicache-storage-backend-extra-config: each backend's keys and defaults (None: required).
# Every backend also takes SGLang's prefetch keys (tokens, seconds; 0 allowed).
HICACHE_PREFETCH_OPTIONS: dict[str, Any] = {
    "prefetch_threshold": 256,
    "prefetch_timeout_base": 1.0,
    "prefetch_timeout_per_ki_token": 0.25,
}
HICACHE_STORAGE_OPTIONS: dict[str, dict[str, Any]] = {
    "file": {
        "file_storage_path": "/tmp/hicache",
        "file_storage_max_size_gb": 10.0,
        **HICACHE_PREFETCH_OPTIONS,
    },
    "mooncake": {  # SGLang's names for the Mooncake store's client
        **HICACHE_PREFETCH_OPTIONS,
        "master_server_address": None,
        "local_hostname": "",  # "": the address --host serves at (the pod's, on 0.0.0.0)
        "protocol": "tcp",
        "device_name": "",
        "global_segment_size": 1 << 30,
        "local_buffer_size": 256 << 20,
    },
}  # constrained.create_grammar_backend
# SGLang's parser names (entrypoints/tool_calls, entrypoints/reasoning): checked here too, as
# configs may not import the entrypoints
TOOL_CALL_PARSERS = ("hermes", "qwen25", "qwen", "llama3", "mistral", "pythonic")
REASONING_PARSERS = ("deepseek-r1", "qwen3", "qwen3-thinking")
API_KEY_ENV = "RADIXSERVE_API_KEY"  # how Kubernetes hands the engine a Secret (secretKeyRef)


@dataclass(frozen=True, slots=True)
class ServerArgs:
    """Every field is a flag of `radixserve serve` (radixserve.config_options): its help and
    choices are in its metadata, and the choices are checked here too."""

    model_path: str = option("smollm2-135m", "HF folder, .gguf file, or alias (smollm2-135m)")
    revision: str | None = option(None, "branch, tag or commit when --model-path is a Hub repo id")
    served_model_name: str | None = option(
        None, "the model name the API reports and accepts (default: model path)"
    )
    dtype: str = option(
        "auto",
        "weights and activations (auto: bfloat16 on GPUs and on CPUs with AVX-512 BF16 / AMX, "
        "else float32)",
        choices=DTYPES,
    )
    device: str = option("cpu", "cpu, or cuda / cuda:N")
    random_seed: int = option(0, "seed of torch's generator and of the random schedule policy")
    # KV memory
    page_size: int = option(1, "tokens per KV page")
    max_total_tokens: int | None = option(
        None, "KV pool size in tokens (default: from --mem-fraction-static)"
    )
    mem_fraction_static: float | None = option(
        None, "KV pool share of memory (default: 0.88 of GPU, 0.2 of free RAM)"
    )
    max_running_requests: int | None = option(
        None, "most requests decoding at once (default: from the pool size)"
    )
    # scheduling
    chunked_prefill_size: int | None = option(
        None,
        "max tokens per prefill chunk; -1 disables (default: on CPU 128 per core of a rank, "
        "within [256, 2048]; off elsewhere)",
    )
    max_prefill_tokens: int = option(16384, "most new tokens in one prefill batch")
    schedule_policy: str = option(
        "lpm",
        "order in which waiting requests are admitted; lpm (longest cached prefix first) and "
        "dfs-weight (shared prefixes together) are cache-aware",
        choices=SCHEDULE_POLICIES,
    )
    schedule_conservativeness: float = option(
        1.0,
        "scales the output-length estimate that admission reserves room for (> 1: admit "
        "fewer requests, retract less)",
    )
    enable_mixed_chunk: bool = option(
        False, "run a prefill chunk and the running decodes in one forward"
    )
    max_queued_requests: int | None = option(
        None, "waiting requests beyond this are refused with a 503"
    )
    disable_radix_cache: bool = option(
        False, "no prefix reuse: each request's KV is freed when it finishes"
    )
    radix_eviction_policy: str = option(
        "lru", "which cached prefixes are evicted first", choices=EVICTION_POLICIES
    )
    # measured within the run-to-run noise under eviction (docs/benchmarks.md)
    waiting_prefix_pin_fraction: float = option(
        0.0, "pin the cached prefixes of waiting requests, up to this fraction of the pool (0: off)"
    )
    # None: off on CPU, where the forward thread and the scheduler compete for the same cores
    disable_overlap_schedule: bool | None = option(
        None, "schedule the next batch after the forward, not during it (default: off on CPU)"
    )
    # not choices: the names are the attention registry's, which checks them at load
    # (attention.registry; configs may not import it)
    attention_backend: str = option(
        "auto",
        "auto (grouped on CPU; flashinfer, else triton, on CUDA) | grouped | torch | triton "
        "| flashinfer",
    )
    # captured at start-up (model_executor/cuda_graph_runner.py), capped by the pool's rows
    cuda_graph_max_bs: int | None = option(
        None, "CUDA: capture decode graphs up to this batch size (default 160)"
    )
    disable_cuda_graph: bool = option(False, "CUDA: run decode eagerly, without captured graphs")
    # fused ops: C++ on the CPU (kernels/cpu/fused_ops.cpp), Triton on CUDA with the triton or
    # flashinfer backend (kernels/fused_ops.py; plus the fused MoE with triton); the PyTorch
    # chains they replace are their oracle
    disable_fused_ops: bool = option(
        False, "PyTorch norm/SiLU/rotary/MoE, not the fused C++ (CPU) / Triton ops"
    )
    # CPU bfloat16: projection weights packed once at load (layers/parallel_linear.py) for our
    # AMX kernel where the CPU has AMX-BF16, else for oneDNN; the three switches are the A/Bs
    disable_weight_prepack: bool = option(
        False, "CPU bf16: plain weights and F.linear, not packed at load"
    )
    disable_amx_gemm: bool = option(
        False,
        "CPU bf16: the projections of a CPU without AMX (row-invariant kernel, or oneDNN) "
        "even where the AMX kernel could run",
    )
    # Where AMX does not run, bf16 projections are packed for our row-invariant kernel
    # (kernels/cpu/rowwise_gemm.cpp: a token's projection is the same bits in any batch, so a
    # cached prompt gets the same answer; as fast as oneDNN or faster on AVX-512 CPUs)
    disable_rowwise_gemm: bool = option(
        False, "CPU bf16 without AMX: oneDNN projections, not our kernel"
    )
    # The grouped backend's multi-token extends (prefill, chunks, cached-prefix extends) go
    # through the paged kernel's tiled entry (kernels/cpu/flash_extend.h) where the build has
    # it; this is the A/B against PyTorch's SDPA
    disable_tiled_extend: bool = option(
        False, "CPU: multi-token extends through PyTorch SDPA, not the tiled C++ kernel"
    )
    # SGLang's flag: every projection through a row-invariant kernel (AMX, else
    # kernels/cpu/rowwise_gemm.cpp, never oneDNN) and every query token's attention through
    # the paged kernel's one path. docs/determinism.md: what it costs
    enable_deterministic_inference: bool = option(
        False,
        "greedy output independent of batching, cache hits and chunking (CPU, grouped "
        "backend): row-invariant projections and one attention path for every token",
    )
    # scheduler/cpu_binding.py; none is the default: measured no faster in serving here
    cpu_bind: str = option(
        "none", "CPU: none (the OS places threads) | auto (pinned to own cores) | 0-3|4-7"
    )
    # parallelism: one scheduler process per rank. Without DP attention dp_size independent
    # scheduling groups of tp_size ranks each; with it tp_size ranks in all, whose attention is
    # split into dp_size DP ranks of tp_size / dp_size ranks (SGLang's convention)
    tp_size: int = option(1, "tensor-parallel ranks (one scheduler process each)")
    dp_size: int = option(
        1, "data-parallel ranks: independent scheduling groups of tp_size ranks each"
    )
    ep_size: int = option(1, "expert-parallel ranks (divides tp_size and the expert count)")
    moe_a2a_backend: str = option(
        "none",
        "EP dispatch: none (all-reduce of local experts' shares) or all_to_all",
        choices=A2A_BACKENDS,
    )
    load_balance_method: str = option(
        "round_robin",
        "DP controller: round_robin, or shortest_queue (fewest in flight)",
        choices=LOAD_BALANCE_METHODS,
    )
    enable_dp_attention: bool = option(
        False, "attention, KV cache and scheduler per DP rank; MLP / MoE over the whole TP group"
    )
    # prefill/decode disaggregation (docs/disaggregation.md): SGLang's flags
    disaggregation_mode: str = option(
        "null",
        "null (co-located), prefill (compute prompts, send their KV), or decode (receive the "
        "KV, then decode)",
        choices=DISAGGREGATION_MODES,
    )
    disaggregation_transfer_backend: str = option(
        "mooncake",
        "how the KV moves: mooncake (TransferEngine, TCP without RDMA), nixl (NIXL agent, UCX), "
        "fake (unit tests: both sides in one process)",
        choices=TRANSFER_BACKENDS,
    )
    disaggregation_bootstrap_port: int = option(
        8998,
        "prefill: the bootstrap server's port; decode: the port of requests that name none",
    )
    disaggregation_ib_device: str | None = option(
        None, "Mooncake: RDMA device(s) to use (default: TCP)"
    )
    disaggregation_decode_enable_radix_cache: bool = option(
        False,
        "decode: keep a radix cache, so the prefill sends only the pages the decode lacks",
    )
    # HiCache (docs/hicache.md)
    enable_hierarchical_cache: bool = option(
        False,
        "keep prefixes evicted from the KV pool in a host-memory tier (and a storage tier) and "
        "load them back on a match, instead of recomputing them",
    )
    hicache_ratio: float = option(2.0, "host tier size as a multiple of the KV pool")
    hicache_size: float = option(
        0.0, "host tier size in GB per rank (overrides --hicache-ratio when > 0)"
    )
    hicache_write_policy: str = option(
        "write_through",
        "when KV is copied to the host tier: on insert (write_through), on the second hit "
        "(write_through_selective), or on eviction (write_back)",
        choices=HICACHE_WRITE_POLICIES,
    )
    hicache_storage_backend: str | None = option(
        None,
        "a storage tier under the host tier, shared by replicas: file (a folder) or mooncake "
        "(a Mooncake store)",
        choices=HICACHE_STORAGE_BACKENDS,
    )
    hicache_storage_prefetch_policy: str = option(
        "timeout",
        "when a request whose prefix is being read from storage may start: with what landed "
        "(best_effort), when the read is done (wait_complete), or when done or after "
        "prefetch_timeout_base + prefetch_timeout_per_ki_token per 1,024 tokens (timeout)",
        choices=HICACHE_PREFETCH_POLICIES,
    )
    hicache_storage_backend_extra_config: str | None = option(
        None,
        'JSON for the storage backend; file: {"file_storage_path": "/tmp/hicache", '
        '"file_storage_max_size_gb": 10}; mooncake: {"master_server_address": "host:port", '
        '"local_hostname", "protocol": "tcp", "device_name", "global_segment_size", '
        '"local_buffer_size"}; both: {"prefetch_threshold": 256, "prefetch_timeout_base": 1, '
        '"prefetch_timeout_per_ki_token": 0.25}',
    )
    # expert load (layers/expert_distribution.py; SGLang's names)
    expert_distribution_recorder_mode: str | None = option(
        None,
        "record how many tokens each MoE layer routes to each expert (stat), read through "
        "/start_expert_distribution_record, /stop_... and /dump_...",
        choices=EXPERT_RECORDER_MODES,
    )
    expert_distribution_recorder_buffer_size: int = option(
        1000, "forward passes the recorder keeps, newest last (-1: all)"
    )
    # expert placement over the EP ranks (layers/expert_location.py, SGLang's EPLB names)
    ep_num_redundant_experts: int = option(
        0, "extra expert slots per MoE layer, holding copies of the busiest experts (EPLB)"
    )
    init_expert_location: str = option(
        "trivial",
        "trivial, or a .pt / .json file or JSON with physical_to_logical_map (used as given) "
        "or logical_count (a recorder dump: placed by EPLB at start)",
    )
    enable_eplb: bool = option(
        False, "rebalance the experts over the EP ranks online, by the recorded load"
    )
    eplb_rebalance_num_iterations: int = option(
        1000, "forward passes between two online rebalances (their counts decide the next)"
    )
    eplb_rebalance_layers_per_chunk: int | None = option(
        None, "layers whose experts move after each forward pass during a rebalance (all)"
    )
    # speculative decoding (speculative/, docs/speculative_decoding.md): SGLang's flag names
    speculative_algorithm: str | None = option(
        None,
        "draft tokens and verify them in one forward: NGRAM (looked up in recent text) or "
        "STANDALONE (a smaller model with the same vocabulary); off by default",
        choices=SPECULATIVE_ALGORITHMS,
    )
    speculative_draft_model_path: str | None = option(
        None, "STANDALONE: the draft model (HF folder, .gguf or alias); the target's tokenizer"
    )
    speculative_num_steps: int | None = option(
        None, f"STANDALONE: draft forwards per verify (default {STANDALONE_STEPS})"
    )
    speculative_eagle_topk: int | None = option(
        None, "draft tokens kept per step: 1 (a chain; trees are not served yet)"
    )
    speculative_num_draft_tokens: int | None = option(
        None,
        f"tokens per verify: the last sampled one plus drafts (NGRAM: {NGRAM_DRAFT_TOKENS}; "
        "STANDALONE: steps + 1)",
    )
    speculative_ngram_min_match_window_size: int = option(
        1, "NGRAM: the shortest context suffix looked up"
    )
    speculative_ngram_max_match_window_size: int = option(
        12, "NGRAM: the longest context suffix looked up (the longest match wins)"
    )
    speculative_ngram_capacity: int = option(
        1_000_000, "NGRAM: tokens of recent requests kept to draft from (oldest dropped)"
    )
    speculative_disable_by_batch_size: int | None = option(
        None, "decode without drafts while this many requests or more run (default: never)"
    )
    # structured outputs (docs/structured_outputs.md)
    grammar_backend: str = option(
        "xgrammar",
        "constrained decoding (json_schema, regex, ebnf, response_format, forced tool calls): "
        "xgrammar, or none (such requests are refused with a 400)",
        choices=GRAMMAR_BACKENDS,
    )
    constrained_json_disable_any_whitespace: bool = option(
        False, "JSON schemas allow no free whitespace (compact JSON only)"
    )
    constrained_json_max_whitespace_cnt: int | None = option(
        None, "most whitespace characters in a row inside constrained JSON (default: no limit)"
    )
    tool_call_parser: str | None = option(
        None,
        "parse tool calls out of chat answers in this model format: "
        + " | ".join(TOOL_CALL_PARSERS)
        + " (default: tool calls only when tool_choice is required or names a function)",
        choices=TOOL_CALL_PARSERS,
    )
    reasoning_parser: str | None = option(
        None,
        "split <think>…</think> into reasoning_content: " + " | ".join(REASONING_PARSERS),
        choices=REASONING_PARSERS,
    )
    # serving
    host: str = option("127.0.0.1", "address the HTTP server binds")
    port: int = option(30000, "HTTP port")
    api_key: str | None = option(  # never in repr, so never logged
        None,
        "require 'Authorization: Bearer KEY' on every endpoint but /health",
        env=API_KEY_ENV,
        repr=False,
    )
    kv_events_port: int | None = option(
        None, "publish radix-tree KV events on this port (replay on port + 1)"
    )
    kv_events_format: str = option(
        "map",
        "KV-event encoding: map (SGLang 0.5.23 / vLLM 0.32 consumers) or array (SGLang 0.5.6)",
        choices=EVENT_FORMATS,
    )
    skip_server_warmup: bool = option(
        False, "serve without first generating one token (the start-up check)"
    )
    # abuse limits
    max_request_body_bytes: int | None = option(
        None,
        "a larger request body is a 413 (default: $RADIXSERVE_MAX_REQUEST_BODY_BYTES, else 32 MiB)",
    )
    header_timeout_s: float | None = option(
        None,
        "close a connection whose request headers take longer (default: "
        "$RADIXSERVE_HEADER_TIMEOUT_S, else 30)",
    )
    # not choices: configure_logging takes any case of these
    log_level: str = option("warning", " | ".join(LOG_LEVELS))
    log_format: str = option(
        "text",
        "text: key=value lines; json: one JSON object per line (stderr)",
        choices=LOG_FORMATS,
    )
    log_requests: bool = option(
        False, "log one line per finished request (id, tokens, TTFT, e2e, finish)"
    )
    log_requests_text: bool = option(
        False, "with --log-requests: also log the prompt and output text"
    )
    # model_loader.generation_defaults
    generation_config: str = option(
        "auto",
        "sampling defaults for unset request fields: auto (the model's "
        "generation_config.json; bundled SmolLM2: temperature 0.2, top_p 0.9), vllm (none), "
        "or a folder / generation_config.json path",
    )

    def __post_init__(self) -> None:
        check_choices(self)
        _check(self.page_size >= 1, "page_size", f"must be ≥ 1, got {self.page_size}")
        cnt = self.constrained_json_max_whitespace_cnt
        name = "constrained_json_max_whitespace_cnt"
        _check(cnt is None or cnt >= 1, name, f"must be ≥ 1, got {cnt}")
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
            self.generation_config in ("auto", "vllm") or Path(self.generation_config).exists(),
            "generation_config",
            f"must be auto, vllm or an existing path, got {self.generation_config!r}",
        )
        self._check_parallelism()
        self._check_disaggregation()
        self._check_hicache()
        size = self.expert_distribution_recorder_buffer_size
        _check(
            size == -1 or size > 0,
            "expert_distribution_recorder_buffer_size",
            f"must be -1 (all) or > 0, got {size}",
        )
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
        self._check_speculative()

    def _check_speculative(self) -> None:
        check_speculative(self)

    @property
    def draft_tokens(self) -> int:
        """Tokens per request in one verify (the last sampled token plus its drafts)."""
        return draft_tokens(self)

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

    def _check_hicache(self) -> None:
        _check(self.hicache_ratio > 0, "hicache_ratio", f"must be > 0, got {self.hicache_ratio}")
        _check(self.hicache_size >= 0, "hicache_size", f"must be ≥ 0, got {self.hicache_size}")
        if not self.enable_hierarchical_cache:
            return
        name = "enable_hierarchical_cache"
        _check(not self.disable_radix_cache, name, "needs the radix cache (--disable-radix-cache)")
        _check(
            self.disaggregation_mode != "decode" or self.disaggregation_decode_enable_radix_cache,
            name,
            "a decode server keeps no radix cache unless "
            "--disaggregation-decode-enable-radix-cache",
        )
        self.hicache_storage_options()  # a malformed extra config fails at start-up

    def hicache_storage_options(self) -> dict[str, Any]:
        """--hicache-storage-backend-extra-config, parsed and checked against the backend's
        keys (defaults filled)."""
        name = "hicache_storage_backend_extra_config"
        raw = self.hicache_storage_backend_extra_config
        try:
            given = json.loads(raw) if raw else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}: not JSON ({exc})") from None
        _check(isinstance(given, dict), name, "must be a JSON object")
        known = HICACHE_STORAGE_OPTIONS[self.hicache_storage_backend or "file"]
        unknown = sorted(set(given) - set(known))
        _check(not unknown, name, f"unknown keys {unknown}; known: {sorted(known)}")
        options = {**known, **given}
        missing = sorted(k for k, v in options.items() if v is None)
        _check(not missing, name, f"{self.hicache_storage_backend} needs {missing}")
        for key, default in known.items():
            value, text = options[key], isinstance(default, str | None)
            zero_ok = key in HICACHE_PREFETCH_OPTIONS
            if text:
                ok = isinstance(value, str)
            else:
                number = isinstance(value, int | float) and not isinstance(value, bool)
                ok = number and (value >= 0 if zero_ok else value > 0)
            want = "a string" if text else ("a number ≥ 0" if zero_ok else "a number > 0")
            _check(ok, name, f"{key}: expected {want}, got {value!r}")
        return options

    def _check_disaggregation(self) -> None:
        if self.disaggregation_mode == "null":
            return
        name = "disaggregation_mode"
        # TP ranks share one set of rooms in lock-step; DP ranks would each need their own
        # (and a rule, agreed by both sides, for which DP rank serves a room)
        _check(
            self.dp_size == 1,
            name,
            f"{self.disaggregation_mode} runs with dp_size = 1 (tp_size may be > 1), "
            f"got dp_size {self.dp_size}",
        )
        port = self.disaggregation_bootstrap_port
        _check(0 < port < 65536, "disaggregation_bootstrap_port", f"must be a port, got {port}")

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
        self._check_eplb()

    def _check_eplb(self) -> None:
        placed = (
            self.ep_num_redundant_experts != 0
            or self.init_expert_location != "trivial"
            or self.enable_eplb
        )
        _check(
            not placed or self.ep_size > 1,
            "ep_size",
            "EPLB (--ep-num-redundant-experts, --init-expert-location, --enable-eplb) places "
            "experts on EP ranks: it needs --ep-size > 1",
        )
        _check(
            self.ep_num_redundant_experts >= 0,
            "ep_num_redundant_experts",
            f"must be ≥ 0, got {self.ep_num_redundant_experts}",
        )
        _check(
            self.eplb_rebalance_num_iterations >= 1,
            "eplb_rebalance_num_iterations",
            f"must be ≥ 1, got {self.eplb_rebalance_num_iterations}",
        )
        chunk = self.eplb_rebalance_layers_per_chunk
        _check(
            chunk is None or chunk >= 1,
            "eplb_rebalance_layers_per_chunk",
            f"must be ≥ 1, got {chunk}",
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
        """Torch threads of each scheduler process on a CPU: `OMP_NUM_THREADS` where the
        deployer set it (per process, as OpenMP reads it; the operator sizes it to the pod's
        CPU request), else its share of the usable cores (the affinity mask, cut to a cgroup
        CPU quota)."""
        explicit = omp_num_threads(os.environ.get("OMP_NUM_THREADS"))
        if explicit is not None:
            return explicit
        usable = usable_cpus(len(os.sched_getaffinity(0)), cgroup_cpu_limit())
        return max(1, usable // self.num_ranks)

    def cpu_threads(self, torch_default: int) -> int:
        """Torch threads each scheduler process runs on a CPU: its share where ranks share the
        CPU, or where OMP_NUM_THREADS or a quota asks for fewer than torch's default (one per
        physical core); that default otherwise."""
        threads = self.cpu_threads_per_rank
        return threads if self.num_ranks > 1 or threads < torch_default else torch_default

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
        if self.enable_dp_attention or self.disaggregation_mode != "null":
            return False  # disaggregation: its queues hook the non-overlapped loop
        if self.speculative_algorithm is not None:
            return False  # a verify's next input is only known once it was accepted
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
