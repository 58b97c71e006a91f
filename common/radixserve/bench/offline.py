"""`radixserve bench offline`: the in-process Engine on the generated-shared-prefix workload,
with the radix cache on and off (SGLang's bench_offline_throughput, GSP dataset).

All requests are submitted at once; reported: request and token throughput, and the cache
hit rate Σ cached_tokens / Σ prompt_tokens from each request's meta_info.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
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
    "requests",
    "input_tok",
    "output_tok",
    "seconds",
    "req_per_s",
    "input_tok_per_s",
    "output_tok_per_s",
    "cache_hit_rate",
)


def add_offline_parser(sub: Any) -> None:
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
    n_in = sum(o["meta_info"]["prompt_tokens"] for o in outs)
    n_out = sum(o["meta_info"]["completion_tokens"] for o in outs)
    cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
    return {
        "requests": len(outs),
        "input_tok": n_in,
        "output_tok": n_out,
        "seconds": seconds,
        "req_per_s": len(outs) / seconds,
        "input_tok_per_s": n_in / seconds,
        "output_tok_per_s": n_out / seconds,
        "cache_hit_rate": cached / max(n_in, 1),
    }


def run_offline(args: argparse.Namespace) -> int:
    from radixserve.engine import EngineCore as Engine  # torch: only for engine benchmarks

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"--modes: unknown {bad}; choose from {sorted(MODES)}")
    print(f"[bench] loading {args.model_path} …", file=sys.stderr, flush=True)
    base = Engine(
        model_path=args.model_path, dtype=args.dtype, max_total_tokens=args.max_total_tokens
    )
    gsp = gsp_from_args(args, base.model_config.vocab_size)
    reqs = generated_shared_prefix(gsp)
    rows = []
    for mode in iter_progress(modes, "bench offline", unit="mode"):
        engine = base.with_args(
            **MODES[mode],
            schedule_policy=args.schedule_policy,
            chunked_prefill_size=args.chunked_prefill_size,
        )
        engine.generate(input_ids=[[1, 2, 3]], sampling_params={"max_new_tokens": 2})  # warm-up
        print(f"[bench] running {len(reqs)} requests, mode {mode} …", file=sys.stderr, flush=True)
        rows.append({"config": mode, **_run_once(engine, reqs)})
        engine.shutdown()
    print_table("offline throughput (generated-shared-prefix)", rows, COLUMNS)
    write_json(
        args.output_file,
        {
            "benchmark": "offline",
            "workload": asdict(gsp),
            "schedule_policy": args.schedule_policy,
            "chunked_prefill_size": args.chunked_prefill_size,
            "dtype": args.dtype,
            "results": rows,
        },
    )
    return 0
