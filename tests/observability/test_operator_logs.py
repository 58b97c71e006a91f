"""`radixserve operator --log-format json` without a cluster: kopf's own records (its login
failure with the traceback) come out as one JSON object per line on stderr."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.child_env import child_env

EXE = os.path.join(os.path.dirname(sys.executable), "radixserve")

pytestmark = pytest.mark.timeout(120)


def test_operator_logs_are_json_lines(tmp_path: Path) -> None:
    env = child_env({"KUBECONFIG": "/nonexistent"})
    env.pop("KUBERNETES_SERVICE_HOST", None)
    cmd = [EXE, "operator", "--log-format", "json", "--liveness", ""]
    # stderr to a file, not a pipe: kopf keeps logging its login retries, and a pipe nobody
    # reads any more fills up and blocks the operator before it can handle Ctrl-C.
    log = tmp_path / "operator.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stderr=err, stdout=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 60
        while "Runtime.login" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0  # Ctrl-C is a clean stop
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    login = [e for e in entries if "Runtime.login" in e["msg"]]
    assert login and login[0]["logger"].startswith("kopf") and login[0]["process"] == "operator"
    assert "Traceback" in login[0]["exc"]  # the traceback, inside the one JSON line
