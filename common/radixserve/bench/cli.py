"""`radixserve bench` subcommands."""

from __future__ import annotations

from typing import Any

from radixserve.bench.cpu_gemm import add_cpu_gemm_parser
from radixserve.bench.offline import add_offline_parser
from radixserve.bench.one_batch import add_one_batch_parser
from radixserve.bench.router import add_router_bench_parser
from radixserve.bench.router_overhead import add_router_overhead_parser
from radixserve.bench.serving import add_serving_parser
from radixserve.bench.soak import add_soak_parser


def add_bench_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmarks (print a table, write JSON)")
    bench_sub = p.add_subparsers(dest="bench", required=True)
    add_offline_parser(bench_sub)
    add_one_batch_parser(bench_sub)
    add_cpu_gemm_parser(bench_sub)
    add_serving_parser(bench_sub)
    add_router_bench_parser(bench_sub)
    add_router_overhead_parser(bench_sub)
    add_soak_parser(bench_sub)
