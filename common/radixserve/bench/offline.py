"""`radixserve bench offline`: the Engine on the generated-shared-prefix workload, with the
radix cache on and off (SGLang's bench_offline_throughput, GSP dataset).

All requests are submitted at once; reported: request and token throughput, and the cache
hit rate Σ cached_tokens / Σ prompt_tokens from each request's meta_info. One process
(`EngineCore`, weights loaded once for every mode) at tp = dp = 1; any other layout
(`--tp-size/--dp-size/--ep-size/--enable-dp-attention`) runs the multi-process `Engine`, one
start per mode. The table names the layout of each row.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from types import MappingProxyType
from typing import Any

from radixserve.bench.datasets import generated_shared_prefix, gsp_from_args
from radixserve.bench.report import print_table, write_json
from radixserve.logging_setup import iter_progress

MODES: Mapping[str, dict[str, bool]] = MappingProxyType(
    {
        "cache": {"disable_radix_cache": False, "disable_overlap_schedule": False},
        "nocache": {"disable_radix_cache": True, "disable_overlap_schedule": False},
        "cache-no-overlap": {"disable_radix_cache": False, "disable_overlap_schedule": True},
    }
)
COLUMNS = (
    "config",
    "layout",
    "requests",
    "failed",
    "input_tok",
    "output_tok",
    "seconds",
    "req_per_s",
    "input_tok_per_s",
    "output_tok_per_s",
    "cache_hit_rate",
)


def add_offline_parser(sub: Any) -> None:
    from radixserve.engine.configs.server_args import A2A_BACKENDS  # torch-free

    p = sub.add_parser(
        "offline", help="offline throughput on generated-shared-prefix, cache on/off"
    )
    p.add_argument("--model-path", default="smollm2-135m")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--gsp-num-groups", type=int, default=8)
    p.add_argument("--gsp-prompts-per-group", type=int, default=8)
    p.add_argument("--gsp-system-prompt-len", type=int, default=512)
    p.add_argument("--gsp-question-len", type=int, default=32)
    p.add_argument("--gsp-output-len", type=int, default=16)
    p.add_argument("--schedule-policy", default="fcfs")
    p.add_argument("--chunked-prefill-size", type=int, default=None)
    p.add_argument("--max-total-tokens", type=int, default=65536)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--ep-size", type=int, default=1)
    p.add_argument("--enable-dp-attention", action="store_true")
    p.add_argument("--moe-a2a-backend", default="none", choices=A2A_BACKENDS)
    p.add_argument(
        "--modes",
        default="cache,nocache,cache-no-overlap",
        help="comma list of: cache, nocache, cache-no-overlap",
    )
    p.add_argument("--output-file", default="bench-results/offline.json")
    p.set_defaults(handler=run_offline)


def _run_once(engine: Any, reqs: list[Any]) -> dict[str, Any]:
    start = time.perf_counter()
    outs = engine.generate(
        input_ids=[r.input_ids for r in reqs],
        sampling_params=[
            {"max_new_tokens": r.output_len, "temperature": 0, "ignore_eos": True} for r in reqs
        ],
    )
    seconds = time.perf_counter() - start
    errors = [o["meta_info"]["finish_reason"] for o in outs]
    errors = [e for e in errors if isinstance(e, dict) and e.get("type") == "abort"]
    if errors:
        print(f"[bench] {len(errors)} requests failed, e.g.: {errors[0]}", file=sys.stderr)
    n_in = sum(o["meta_info"]["prompt_tokens"] for o in outs)
    n_out = sum(o["meta_info"]["completion_tokens"] for o in outs)
    cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
    return {
        "requests": len(outs),
        "failed": len(errors),
        "input_tok": n_in,
        "output_tok": n_out,
        "seconds": seconds,
        "req_per_s": len(outs) / seconds,
        "input_tok_per_s": n_in / seconds,
        "output_tok_per_s": n_out / seconds,
        "cache_hit_rate": cached / max(n_in, 1),
    }


def _layout(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "tp_size": args.tp_size,
        "dp_size": args.dp_size,
        "ep_size": args.ep_size,
        "enable_dp_attention": args.enable_dp_attention,
        "moe_a2a_backend": args.moe_a2a_backend,
    }


def layout_name(layout: Mapping[str, Any]) -> str:
    """e.g. `tp2 dp2 ep2 dp-attn a2a=all_to_all`, or `tp1` for one process."""
    parts = [f"tp{layout['tp_size']}"]
    parts += [f"{k[:2]}{layout[k]}" for k in ("dp_size", "ep_size") if layout[k] != 1]
    if layout["enable_dp_attention"]:
        parts.append("dp-attn")
    if layout["ep_size"] != 1:
        parts.append(f"a2a={layout['moe_a2a_backend']}")
    return " ".join(parts)


def _engines(args: argparse.Namespace, modes: list[str]) -> Iterator[tuple[str, Any]]:
    """(mode, engine) for each mode; the caller shuts each engine down."""
    common = {
        "model_path": args.model_path,
        "dtype": args.dtype,
        "max_total_tokens": args.max_total_tokens,
        "schedule_policy": args.schedule_policy,
        "chunked_prefill_size": args.chunked_prefill_size,
    }
    layout = _layout(args)
    if layout["tp_size"] == layout["dp_size"] == 1:
        from radixserve.engine import EngineCore  # torch: only for engine benchmarks

        base = EngineCore(**common)
        for mode in modes:
            yield mode, base.with_args(**MODES[mode])
        return
    from radixserve.engine import Engine

    for mode in modes:
        yield mode, Engine(**common, **layout, **MODES[mode])


def _vocab_size(engine: Any) -> int:
    config = getattr(engine, "model_config", None)  # EngineCore
    if config is not None:
        return int(config.vocab_size)
    return int(engine.state.limits.vocab_size)  # the multi-process Engine


def run_offline(args: argparse.Namespace) -> int:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"--modes: unknown {bad}; choose from {sorted(MODES)}")
    layout = layout_name(_layout(args))
    print(f"[bench] loading {args.model_path} ({layout}) …", file=sys.stderr, flush=True)
    rows = []
    engines = _engines(args, modes)
    gsp = None
    for mode, engine in iter_progress(engines, "bench offline", unit="mode"):
        try:
            gsp = gsp_from_args(args, _vocab_size(engine))
            reqs = generated_shared_prefix(gsp)
            engine.generate(input_ids=[[1, 2, 3]], sampling_params={"max_new_tokens": 2})
            print(f"[bench] running {len(reqs)} requests, mode {mode} …", file=sys.stderr)
            rows.append({"config": mode, "layout": layout, **_run_once(engine, reqs)})
        finally:
            engine.shutdown()
    print_table("offline throughput (generated-shared-prefix)", rows, COLUMNS)
    write_json(
        args.output_file,
        {
            "benchmark": "offline",
            "workload": asdict(gsp) if gsp is not None else None,
            "layout": _layout(args),
            "schedule_policy": args.schedule_policy,
            "chunked_prefill_size": args.chunked_prefill_size,
            "dtype": args.dtype,
            "results": rows,
        },
    )
    return 1 if any(row["failed"] for row in rows) else 0
