"""`radixserve bench cpu-gemm` as a user runs it (the CLI in a subprocess) on small shapes: it
prints its table and writes one JSON row per row count with both paths timed (no speed is
asserted: speed lives in the benchmark's output). Its kernel is serving's default for this CPU:
the AMX one where the CPU's flags list AMX-BF16, else the row-invariant one; `--kernel amx`
elsewhere exits with a message saying why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.child_env import child_env
from tests.kernels.amx import cpu_has_amx

SMALL = (
    "--hidden", "64", "--intermediate", "96", "--heads", "4", "--kv-heads", "2",
    "--head-dim", "16", "--layers", "2", "--vocab", "128", "--rows", "1,33", "--repeats", "2",
)  # fmt: skip


def _cpu_gemm(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "radixserve.cli", "bench", "cpu-gemm", *SMALL, *flags,
         "--output-file", str(tmp_path / "gemm.json")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=child_env(),
    )  # fmt: skip


@pytest.mark.parametrize("kernel", ["auto", "rowwise"])
def test_bench_cpu_gemm_prints_and_writes_both_paths(tmp_path: Path, kernel: str) -> None:
    run = _cpu_gemm(tmp_path, "--kernel", kernel)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "onednn_ms" in run.stdout and "kernel_ms" in run.stdout
    report = json.loads((tmp_path / "gemm.json").read_text())
    default = "amx" if cpu_has_amx() else "rowwise"
    assert report["kernel"] == (default if kernel == "auto" else kernel)
    assert f"kernel {report['kernel']}," in run.stdout
    # 2 layers x 4 projections (+ the LM head) of these shapes, in bf16
    weights = 2 * (128 * 64 + 64 * 64 + 192 * 64 + 64 * 96) + 128 * 64
    assert report["weight_bytes"] == 2 * weights
    assert [r["rows"] for r in report["results"]] == [1, 33]
    for row in report["results"]:
        assert row["onednn_ms"] > 0 and row["kernel_ms"] > 0
        assert abs(row["speedup"] - row["onednn_ms"] / row["kernel_ms"]) < 1e-9
        flops = 2 * row["rows"] * weights
        assert abs(row["kernel_gflop_s"] - flops / row["kernel_ms"] / 1e6) < 1e-6


def test_bench_cpu_gemm_names_why_the_amx_kernel_cannot_run(tmp_path: Path) -> None:
    if cpu_has_amx():
        pytest.skip("this CPU runs the AMX kernel (the test above times it)")
    run = _cpu_gemm(tmp_path, "--kernel", "amx")
    assert run.returncode != 0 and "no AMX-BF16" in run.stderr, run.stderr[-3000:]
    assert "Traceback" not in run.stderr


def test_bench_cpu_gemm_rejects_bad_arguments_with_a_cli_error(tmp_path: Path) -> None:
    for flags, message in (
        (("--rows", "1,x"), "argument --rows: must be a whole number >= 1, got 'x'"),
        (("--rows", "32,0"), "argument --rows: must be a whole number >= 1, got '0'"),
        (("--layers", "0"), "argument --layers: must be a whole number >= 1"),
        (("--vocab", "-3"), "argument --vocab: must be a whole number >= 0"),
    ):
        run = subprocess.run(
            [sys.executable, "-m", "radixserve.cli", "bench", "cpu-gemm", *flags],
            capture_output=True, text=True, timeout=120, cwd=tmp_path, env=child_env(),
        )  # fmt: skip
        assert run.returncode == 2 and message in run.stderr, run.stderr[-2000:]
        assert "Traceback" not in run.stderr
