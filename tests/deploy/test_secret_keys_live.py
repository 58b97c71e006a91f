"""The operator's Secret-based keys, live: an engine and a router started with the command
lines the operator renders and the environment the kubelet would give them (every
secretKeyRef resolved against a Secret made here with fresh random keys). The openai client
is the oracle: without the key the router answers 401, with it a chat completes and equals the
engine's own greedy answer; the engine refuses a caller without the key; the admin API opens
only with the admin key. Then every log file the test wrote (and every radixserve log in
/tmp) is searched for both keys: neither may appear."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from radixserve.operator.builders import build_children
from radixserve.operator.config import OperatorConfig
from radixserve.operator.meta import Owner
from radixserve.operator.spec import parse_spec
from tests.child_env import child_env
from tests.operator.cases import UID
from tests.operator.test_secret_keys import resolve_env
from tests.ports import free_port, free_port_pair

EXE = os.path.join(os.path.dirname(sys.executable), "radixserve")
START_TIMEOUT_S = 300
SPEC: dict[str, Any] = {
    "model": {"name": "smollm2-135m", "source": {"builtin": "smollm2-135m"}},
    "engine": {"kvCache": {"maxTotalTokens": 4096}},
    "apiKeySecretRef": {"name": "chat-keys"},
    "router": {"adminKeySecretRef": {"name": "chat-keys", "key": "admin"}},
}
MESSAGES: list[Any] = [{"role": "user", "content": "Name three colours."}]


def _rendered() -> dict[str, dict[str, Any]]:
    owner = Owner(name="chat", namespace="llm", uid=UID)
    children = build_children(owner, parse_spec(SPEC, "chat"), OperatorConfig())
    return {
        c["metadata"]["name"]: c["spec"]["template"]["spec"]["containers"][0]
        for c in children
        if c["kind"] == "Deployment"
    }


def _set(args: list[str], flag: str, value: str) -> list[str]:
    i = args.index(flag)
    return [*args[: i + 1], value, *args[i + 2 :]]


def _drop(args: list[str], flag: str) -> list[str]:
    i = args.index(flag)
    return args[:i] + args[i + 2 :]


@contextmanager
def _process(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [EXE, *args], stdout=out, stderr=subprocess.STDOUT, cwd=log.parent,
            env=child_env({"OMP_NUM_THREADS": "1", **env}), start_new_session=True,
        )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{url} exited during start-up:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{url} not ready:\n{log.read_text()[-3000:]}")


def _chat(base: str, key: str) -> str:
    client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)
    out = client.chat.completions.create(
        model="smollm2-135m", messages=MESSAGES, max_tokens=12, temperature=0
    )
    return out.choices[0].message.content or ""


def _check_keys(engine: str, router: str, api_key: str, admin_key: str) -> None:
    with pytest.raises(openai.AuthenticationError):
        _chat(router, "wrong-key")
    with pytest.raises(openai.AuthenticationError):
        _chat(engine, "wrong-key")
    assert _chat(router, api_key) == _chat(engine, api_key)
    client_auth = {"authorization": f"Bearer {api_key}"}
    assert httpx.get(router + "/workers", headers=client_auth).status_code == 401
    admin = httpx.get(router + "/workers", headers={"authorization": f"Bearer {admin_key}"})
    assert admin.status_code == 200 and [w["url"] for w in admin.json()["workers"]] == [engine]
    assert httpx.get(router + "/v1/models").status_code == 401
    assert httpx.get(router + "/v1/models", headers=client_auth).status_code == 200
    for url in (engine, router):  # Prometheus scrapes without a key
        assert httpx.get(url + "/metrics").status_code == 200


def test_secret_keys_work_and_never_reach_a_log(tmp_path: Path) -> None:
    api_key, admin_key = f"ak-{secrets.token_hex(16)}", f"adm-{secrets.token_hex(16)}"
    secret = {"chat-keys": {"api-key": api_key, "admin": admin_key}}
    c = _rendered()
    engine_port, router_port = free_port(), free_port()
    engine_args = _set(
        _set(c["chat-engine"]["args"], "--port", str(engine_port)), "--host", "127.0.0.1"
    )
    engine_args = _set(engine_args, "--kv-events-port", str(free_port_pair()))
    router_args = _drop(_drop(c["chat-router"]["args"], "--k8s-service"), "--k8s-namespace")
    router_args = _set(_set(router_args, "--port", str(router_port)), "--host", "127.0.0.1")
    engine, router = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{router_port}"
    router_args += ["--worker-urls", engine, "--health-check-interval-s", "0.5"]
    assert api_key not in " ".join(engine_args + router_args)
    e_log, r_log = tmp_path / "engine.log", tmp_path / "router.log"
    with _process(
        engine_args + ["--log-level", "info"], resolve_env(c["chat-engine"], secret), e_log
    ) as e:
        _wait(engine + "/health", e, e_log)
        r_env = resolve_env(c["chat-router"], secret)
        with _process(router_args + ["--log-level", "info"], r_env, r_log) as r:
            _wait(router + "/readiness", r, r_log)
            _check_keys(engine, router, api_key, admin_key)
    logs = [p for p in tmp_path.rglob("*") if p.is_file()] + list(
        Path("/tmp").glob("radixserve*.log")
    )
    assert e_log in logs and r_log in logs and r_log.stat().st_size > 0
    for path in logs:
        text = path.read_bytes()
        assert api_key.encode() not in text and admin_key.encode() not in text, path
