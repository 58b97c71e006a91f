"""`radixserve operator --log-format json` without a cluster: kopf's own records (its login
failure with the traceback) come out as one JSON object per line on stderr."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

EXE = os.path.join(os.path.dirname(sys.executable), "radixserve")

pytestmark = pytest.mark.timeout(120)


def test_operator_logs_are_json_lines() -> None:
    env = {**os.environ, "KUBECONFIG": "/nonexistent"}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    cmd = [EXE, "operator", "--log-format", "json", "--liveness", ""]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # until kopf reports that it cannot log in
            lines.append(line)
            if "Runtime.login" in line:
                break
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    entries = [json.loads(line) for line in lines if line.strip()]
    login = [e for e in entries if "Runtime.login" in e["msg"]]
    assert login and login[0]["logger"].startswith("kopf") and login[0]["process"] == "operator"
    assert "Traceback" in login[0]["exc"]  # the traceback, inside the one JSON line
