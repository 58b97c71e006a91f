"""`radixserve bench offline` as a user runs it (the CLI in a subprocess) on a tiny random-weight
Llama (64-token chunks, so later requests find the earlier ones' prefixes): one process with the
cache on and off, then the multi-process engine at tp=2, dp=2 with DP attention. Each run prints
its table with the layout of every row and writes the JSON; every request is served, and the
cache is hit only where it is on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.child_env import child_env
from tests.engine.models.tiny import save_tiny

WORKLOAD = (
    "--gsp-num-groups", "2", "--gsp-prompts-per-group", "4", "--gsp-system-prompt-len", "64",
    "--gsp-question-len", "8", "--gsp-output-len", "4", "--dtype", "float32",
    "--max-total-tokens", "2048", "--chunked-prefill-size", "64",
)  # fmt: skip


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("llama")
    save_tiny("llama", folder, seed=1)
    return folder


def _bench(model: Path, out: Path, *flags: str) -> tuple[str, dict]:
    cmd = [sys.executable, "-m", "radixserve.cli", "bench", "offline", "--model-path", str(model)]
    run = subprocess.run(
        [*cmd, *WORKLOAD, *flags, "--output-file", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=out.parent,
        env=child_env(),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout, json.loads(out.read_text())


@pytest.mark.parametrize(
    ("flags", "layout", "modes"),
    [
        ((), "tp1", ("cache", "nocache")),
        (
            ("--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"),
            "tp2 dp2 dp-attn",
            ("cache",),
        ),
    ],
)
def test_offline_table_names_the_layout(
    model: Path, tmp_path: Path, flags: tuple[str, ...], layout: str, modes: tuple[str, ...]
) -> None:
    stdout, report = _bench(model, tmp_path / "offline.json", *flags, "--modes", ",".join(modes))
    rows = report["results"]
    assert [r["config"] for r in rows] == list(modes)
    assert all(r["layout"] == layout and r["requests"] == 8 and r["failed"] == 0 for r in rows)
    assert all(r["output_tok"] == 8 * 4 for r in rows)
    for row in rows:
        assert (row["cache_hit_rate"] > 0) == (row["config"] == "cache"), row
        (line,) = [ln for ln in stdout.splitlines() if ln.split()[:1] == [row["config"]]]
        assert f" {layout} " in line, stdout  # the printed table names the layout
    assert report["layout"]["enable_dp_attention"] == ("--enable-dp-attention" in flags)


def test_failed_requests_are_counted_and_fail_the_run(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "offline.json"
    cmd = [sys.executable, "-m", "radixserve.cli", "bench", "offline", "--model-path", str(model)]
    run = subprocess.run(  # prompts of 264 tokens: beyond the tiny model's 256-token context
        [*cmd, *WORKLOAD, "--gsp-system-prompt-len", "256", "--modes", "cache"]
        + ["--output-file", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(),
    )
    assert run.returncode == 1
    assert "8 requests failed" in run.stderr and "the prompt has 264 tokens" in run.stderr
    assert json.loads(out.read_text())["results"][0]["failed"] == 8
