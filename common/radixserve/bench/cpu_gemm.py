"""`radixserve bench cpu-gemm`: a model's bf16 projections on the CPU, oneDNN against our
kernel, side by side in one run. The kernel is the one serving uses by default on this CPU
(`--kernel auto`): the AMX kernel (kernels/cpu/amx_gemm.cpp) where AMX-BF16 runs, else the
row-invariant one (rowwise_gemm.cpp: AVX512-BF16, AVX-512 or AVX2 code, chosen at build).

Every layer gets its own random weights (as many as the model has), so the weights come from
memory as in a decode step rather than from cache. For each row count the two paths run in
alternation, `--repeats` times each, so the machine's drift falls on both; the table gives the
median time over all projections of all layers (+ the LM head), the weight bytes read per
second, the kernel's multiply rate (2 FLOP per weight per row), and the speed-up. A copy of
512 MiB first measures the memory bandwidth to compare.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from radixserve.bench.report import print_table, write_json

if TYPE_CHECKING:
    import torch

COLUMNS = (
    "rows", "onednn_ms", "kernel_ms", "speedup", "onednn_gb_s", "kernel_gb_s", "kernel_gflop_s",
)  # fmt: skip
KERNELS = ("auto", "amx", "rowwise")


def _whole(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum}, got {text!r}")
    return value


def _positive(text: str) -> int:
    """A CLI count or size: a whole number ≥ 1."""
    return _whole(text, 1)


def _vocab(text: str) -> int:
    """--vocab: LM head rows, 0 for none."""
    return _whole(text, 0)


def _row_counts(text: str) -> list[int]:
    """--rows: comma-separated row counts, each ≥ 1."""
    return [_positive(part.strip()) for part in text.split(",")]


def add_cpu_gemm_parser(sub: Any) -> None:
    p = sub.add_parser(
        "cpu-gemm",
        help="bf16 projections of a model's shapes: oneDNN vs our kernel (CPU)",
    )
    p.add_argument("--hidden", type=_positive, default=576, help="SmolLM2-135M's shapes by default")
    p.add_argument("--intermediate", type=_positive, default=1536)
    p.add_argument("--heads", type=_positive, default=9)
    p.add_argument("--kv-heads", type=_positive, default=3)
    p.add_argument("--head-dim", type=_positive, default=64)
    p.add_argument("--layers", type=_positive, default=30)
    p.add_argument("--vocab", type=_vocab, default=49152, help="LM head rows (0: none)")
    p.add_argument(
        "--rows", type=_row_counts, default=[1, 8, 32, 64, 256], help="comma-separated batch rows"
    )
    p.add_argument("--repeats", type=_positive, default=5)
    p.add_argument(
        "--kernel",
        choices=KERNELS,
        default="auto",
        help="ours: the AMX kernel where it runs, else the row-invariant one (auto); or name one",
    )
    p.add_argument("--output-file", default="bench-results/cpu_gemm.json")
    p.set_defaults(handler=run_cpu_gemm)


def _shapes(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(n, k) of one layer's projections: q/k/v, o, gate/up, down."""
    h, d = args.hidden, args.head_dim
    qkv = (args.heads + 2 * args.kv_heads) * d
    return [(qkv, h), (args.heads * d, h), (2 * args.intermediate, h), (h, args.intermediate)]


def _copy_gb_s() -> float:
    import torch  # the CLI imports this module without torch (router/operator images)

    a = torch.ones(2**28, dtype=torch.bfloat16)
    b = torch.empty_like(a)
    b.copy_(a)
    start = time.perf_counter()
    for _ in range(5):
        b.copy_(a)
    return 2 * a.nbytes * 5 / (time.perf_counter() - start) / 1e9


def _timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _kernel(name: str) -> tuple[str, Any]:
    """(name, library) of the kernel to time; SystemExit saying why where it can't run."""
    from radixserve.kernels.cpu.amx_gemm import build_amx_gemm
    from radixserve.kernels.cpu.rowwise_gemm import build_rowwise_gemm

    errors = []
    for kernel, build in (("amx", build_amx_gemm), ("rowwise", build_rowwise_gemm)):
        if name not in ("auto", kernel):
            continue
        try:
            return kernel, build()
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
            errors.append(f"the {kernel} kernel can't run here: {exc}")
    raise SystemExit("bench cpu-gemm: " + "; ".join(errors))


def run_cpu_gemm(args: argparse.Namespace) -> int:
    import torch

    kernel_name, kernel = _kernel(args.kernel)
    shapes = _shapes(args) * args.layers + ([(args.vocab, args.hidden)] if args.vocab else [])
    print(f"[bench] packing {len(shapes)} weights twice (oneDNN and {kernel_name}) …", flush=True)
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=g).to(torch.bfloat16) for n, k in shapes]
    onednn = [torch.ops.mkldnn._reorder_linear_weight(w, 256) for w in weights]
    packed = [kernel.pack(w) for w in weights]
    tiles = [t for t in packed if t is not None]
    if len(tiles) != len(packed):
        raise SystemExit(f"bench cpu-gemm: a shape the {kernel_name} kernel does not take")
    weight_bytes = sum(w.nbytes for w in weights)
    weight_count = sum(n * k for n, k in shapes)
    del weights
    bandwidth = _copy_gb_s()
    rows_out = []
    for rows in args.rows:
        xs = {k: torch.randn(rows, k, generator=g).to(torch.bfloat16) for _, k in shapes}

        def run_onednn(xs: dict[int, torch.Tensor] = xs) -> None:
            for (_, k), p in zip(shapes, onednn, strict=True):
                torch.ops.mkldnn._linear_pointwise(xs[k], p, None, "none", [], "")

        def run_kernel(xs: dict[int, torch.Tensor] = xs) -> None:
            for (_, k), t in zip(shapes, tiles, strict=True):
                t.linear(xs[k])

        run_onednn()  # warm-up
        run_kernel()
        a, b = [], []
        for _ in range(args.repeats):
            a.append(_timed(run_onednn))
            b.append(_timed(run_kernel))
        ta, tb = statistics.median(a), statistics.median(b)
        rows_out.append({
            "rows": rows, "onednn_ms": ta * 1e3, "kernel_ms": tb * 1e3, "speedup": ta / tb,
            "onednn_gb_s": weight_bytes / ta / 1e9, "kernel_gb_s": weight_bytes / tb / 1e9,
            "kernel_gflop_s": 2 * rows * weight_count / tb / 1e9,
        })  # fmt: skip
    title = (
        f"cpu gemm: {len(shapes)} bf16 weights, {weight_bytes / 2**20:.0f} MiB, kernel "
        f"{kernel_name}, "
        f"{torch.get_num_threads()} threads; copy {bandwidth:.1f} GB/s (read + write)"
    )
    print_table(title, rows_out, COLUMNS)
    write_json(
        args.output_file,
        {
            "weight_bytes": weight_bytes,
            "kernel": kernel_name,
            "copy_gb_s": bandwidth,
            "threads": torch.get_num_threads(),
            "results": rows_out,
        },
    )
    return 0
