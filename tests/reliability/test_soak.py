"""`radixserve bench soak` itself, short: two tiny random-weight replicas behind the router,
mixed traffic for 14 s, one replica SIGKILLed (its whole process tree) after 6 s and started
again. The command is run as a user runs it, and its JSON report is checked against its
promises: nothing lost before the first byte (the router retries those), every stream that
broke after it ended with an SSE error event and `[DONE]`, KV usage of every replica back to
0, memory and fds reported for every process tree, exit status 0.

Start-up and the restart of a replica take 25 to 45 s each on this shared 2-core machine, so
the test takes 60 to 120 s: `slow`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.child_env import child_env
from tests.ports import free_port, free_port_run
from tests.reliability.conftest import save_tiny_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

REPLICAS = 2
MIX = ("generate", "generate_stream", "completions_n2_logprobs", "chat_stream_stop",
       "stream_disconnect", "abort")  # fmt: skip


def _soak(tmp: Path, model: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    exe = os.path.join(os.path.dirname(sys.executable), "radixserve")
    out = tmp / "report.json"
    cmd = [
        exe, "bench", "soak", "--model-path", str(model), "--replicas", str(REPLICAS),
        "--duration-s", "14", "--kill-every-s", "6", "--concurrency", "4",
        "--max-new-tokens", "48", "--router-port", str(free_port()),
        "--engine-base-port", str(free_port_run(REPLICAS)),
        "--kv-events-base-port", str(free_port_run(2 * REPLICAS)),
        "--engine-args", "--max-total-tokens 8192", "--log-dir", str(tmp / "logs"),
        "--output", str(out), *extra,
    ]  # fmt: skip
    # run outside the repository: its top-level operator/ would shadow the stdlib's `operator`
    proc = subprocess.run(
        cmd, cwd=tmp, capture_output=True, text=True, timeout=400, env=child_env()
    )
    report = json.loads(out.read_text()) if out.exists() else {}
    return proc.returncode, report, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("soak-tiny"))


def test_soak_with_one_kill_loses_nothing_and_reports_every_process(
    tmp_path: Path, tiny_model: Path
) -> None:
    rc, report, output = _soak(tmp_path, tiny_model)
    assert report, output[-3000:]
    s = report["summary"]
    assert rc == 0, (s, report["examples"], output[-3000:])
    # every request is in exactly one class, and every kind of the mix was sent
    classes = ("completed", "left_by_client", "failed_before_first_byte")
    classes += ("failed_after_first_byte_clean", "failed_after_first_byte_unclean")
    assert s["sent"] == sum(s[c] for c in classes) == sum(report["outcomes"].values()), s
    kinds = {key.split(":", 1)[0] for key in report["outcomes"]}
    assert kinds == set(MIX), report["outcomes"]
    assert s["completed"] > 0 and s["left_by_client"] > 0, s
    # the promises: retried before the first byte, a clean SSE error after it
    assert s["failed_before_first_byte"] == 0, (s, report["examples"])
    assert s["failed_after_first_byte_unclean"] == 0, (s, report["examples"])
    # one kill, and the replica came back
    assert s["kills"] == 1, report["events"]
    assert re.fullmatch(r"replica 0 killed and back in [\d.]+s", report["events"][0])
    # KV usage of every replica once idle: 0 (a leak is > 0, a double free < 0)
    kv = s["kv_token_usage_at_end"]
    assert len(kv) == REPLICAS and all(v == 0 for v in kv.values()), kv
    # resident memory and open fds of every process tree, at the start and at the end
    rows = {row["process"]: row for row in report["processes"]}
    assert set(rows) == {"engine 0", "engine 1", "router"}, rows
    for name, row in rows.items():
        for key in ("start_rss_kib", "start_fds", "end_rss_kib", "end_fds"):
            assert row[key] > 0, (name, row)
    assert 0 < s["p50_s"] <= s["p99_s"], s
