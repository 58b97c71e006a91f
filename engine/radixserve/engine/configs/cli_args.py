"""Command-line flags for ServerArgs, derived from its fields so each flag is defined once:
`--field-name` with the field's type and default; booleans are `--flag` switches."""

from __future__ import annotations

import argparse
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, fields
from types import MappingProxyType
from typing import Any

from radixserve.engine.configs.server_args import ServerArgs

API_KEY_ENV = "RADIXSERVE_API_KEY"  # how Kubernetes hands the engine a Secret (secretKeyRef)

_HELP: Mapping[str, str] = MappingProxyType(
    {
        "model_path": "HF folder, .gguf file, or alias (smollm2-135m)",
        "revision": "branch, tag or commit when --model-path is a Hub repo id",
        "served_model_name": "the model name the API reports and accepts (default: model path)",
        "dtype": "float32 | bfloat16 | float16 | auto",
        "device": "cpu, or cuda / cuda:N",
        "random_seed": "seed of torch's generator and of the random schedule policy",
        "mem_fraction_static": "KV pool share of memory (default: 0.88 of GPU, 0.2 of free RAM)",
        "max_running_requests": "most requests decoding at once (default: from the pool size)",
        "max_prefill_tokens": "most new tokens in one prefill batch",
        "schedule_conservativeness": (
            "scales the output-length estimate that admission reserves room for (> 1: admit "
            "fewer requests, retract less)"
        ),
        "enable_mixed_chunk": "run a prefill chunk and the running decodes in one forward",
        "max_queued_requests": "waiting requests beyond this are refused with a 503",
        "disable_radix_cache": "no prefix reuse: each request's KV is freed when it finishes",
        "radix_eviction_policy": "lru | lfu | fifo: which cached prefixes are evicted first",
        "waiting_prefix_pin_fraction": (
            "pin the cached prefixes of waiting requests, up to this fraction of the pool (0: off)"
        ),
        "disable_overlap_schedule": (
            "schedule the next batch after the forward, not during it (default: off on CPU)"
        ),
        "attention_backend": (
            "auto (grouped on CPU; flashinfer, else triton, on CUDA) | grouped | torch | triton "
            "| flashinfer"
        ),
        "cuda_graph_max_bs": "CUDA: capture decode graphs up to this batch size (default 160)",
        "disable_cuda_graph": "CUDA: run decode eagerly, without captured graphs",
        "enable_dp_attention": (
            "attention, KV cache and scheduler per DP rank; MLP / MoE over the whole TP group"
        ),
        "host": "address the HTTP server binds",
        "port": "HTTP port",
        "skip_server_warmup": "serve without first generating one token (the start-up check)",
        "max_request_body_bytes": (
            "a larger request body is a 413 (default: $RADIXSERVE_MAX_REQUEST_BODY_BYTES, "
            "else 32 MiB)"
        ),
        "header_timeout_s": (
            "close a connection whose request headers take longer (default: "
            "$RADIXSERVE_HEADER_TIMEOUT_S, else 30)"
        ),
        "log_level": "debug | info | warning | error",
        "page_size": "tokens per KV page",
        "max_total_tokens": "KV pool size in tokens (default: from mem_fraction_static)",
        "chunked_prefill_size": "max tokens per prefill chunk (-1 disables)",
        "schedule_policy": "fcfs | lpm | dfs-weight | lof | random",
        "enable_kv_events": "record radix-tree KV events (implied by --kv-events-port, needs it)",
        "kv_events_port": "publish radix-tree KV events on this port (replay on port + 1)",
        "kv_events_format": "KV-event encoding: map (SGLang 0.5.23 / vLLM 0.32) or array (0.5.6)",
        "disable_fused_ops": "PyTorch norm/SiLU/rotary/MoE, not the fused C++ (CPU) / Triton ops",
        "disable_weight_prepack": "CPU bf16: plain weights and F.linear, not packed at load",
        "disable_amx_gemm": (
            "CPU bf16: the projections of a CPU without AMX (row-invariant kernel, or oneDNN) "
            "even where the AMX kernel could run"
        ),
        "disable_rowwise_gemm": "CPU bf16 without AMX: oneDNN projections, not our kernel",
        "enable_deterministic_inference": (
            "greedy output independent of batching, cache hits and chunking (CPU, grouped "
            "backend): row-invariant projections and one attention path for every token"
        ),
        "cpu_bind": "CPU: none (the OS places threads) | auto (pinned to own cores) | 0-3|4-7",
        "tp_size": "tensor-parallel ranks (one scheduler process each)",
        "dp_size": "data-parallel ranks: independent scheduling groups of tp_size ranks each",
        "ep_size": "expert-parallel ranks (divides tp_size and the expert count)",
        "moe_a2a_backend": "EP dispatch: none (all-reduce of local experts) or all_to_all",
        "load_balance_method": "DP controller: round_robin or shortest_queue (fewest in flight)",
        "api_key": (
            "require 'Authorization: Bearer KEY' on every endpoint but /health "
            f"(default: ${API_KEY_ENV}, which keeps the key out of the command line)"
        ),
        "log_format": "text: key=value lines; json: one JSON object per line (stderr)",
        "log_requests": "log one line per finished request (id, tokens, TTFT, e2e, finish)",
        "log_requests_text": "with --log-requests: also log the prompt and output text",
        "generation_config": (
            "sampling defaults for unset request fields: auto (the model's "
            "generation_config.json; bundled SmolLM2: temperature 0.2, top_p 0.9), vllm (none), "
            "or a folder / generation_config.json path"
        ),
    }
)
_SCALARS = (bool, int, float, str)


def flag_type(hint: Any) -> type:
    """The argparse type of a resolved field annotation: `int | None` and `Optional[int]` are
    `int`; anything that is not one scalar (after dropping None) is parsed as a string."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else str
    return hint if hint in _SCALARS else str


def add_server_args(parser: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(ServerArgs)
    for f in fields(ServerArgs):
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not MISSING else None
        typ = flag_type(hints[f.name])
        if typ is bool:
            parser.add_argument(flag, action="store_true", default=default, help=_HELP.get(f.name))
        else:
            parser.add_argument(flag, type=typ, default=default, help=_HELP.get(f.name))


def server_args_from_namespace(
    ns: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> ServerArgs:
    """ServerArgs from the parsed flags; `--api-key` falls back to $RADIXSERVE_API_KEY."""
    values = {f.name: getattr(ns, f.name) for f in fields(ServerArgs)}
    if values["api_key"] is None:
        values["api_key"] = environ.get(API_KEY_ENV) or None
    return ServerArgs(**values)
