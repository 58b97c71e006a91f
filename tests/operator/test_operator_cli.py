"""`radixserve operator` as a real process: logs in through a kubeconfig (kopf's default
login, as outside a cluster), reconciles against the emulated API server, answers its
liveness probe, and exits cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import kmock
import pytest
import yaml

from tests.operator.cases import SMOLLM_CPU
from tests.operator.emulator import ApiServer
from tests.operator.test_operator_kmock import CHILDREN, Cluster, eventually
from tests.ports import free_port

pytestmark = pytest.mark.timeout(60)
RADIXSERVE = Path(sys.executable).parent / "radixserve"


def _kubeconfig(path: Path, server: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "tester", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "test", "context": {"cluster": "emulator", "user": "tester"}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(config))


async def _healthy(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(url) as resp:
            return resp.status == 200
    except aiohttp.ClientError:
        return False


def test_operator_command_reconciles_and_stops(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with ApiServer() as api, kmock.Server(api):
            api.declare_resources()
            _kubeconfig(tmp_path / "kubeconfig", str(api.url).rstrip("/"))
            env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
            env |= {"KUBECONFIG": str(tmp_path / "kubeconfig"), "HOME": str(tmp_path)}
            env |= {"RADIXSERVE_ENGINE_IMAGE": "registry.local/engine:dev"}
            health = f"http://127.0.0.1:{free_port()}/healthz"
            proc = await asyncio.create_subprocess_exec(
                str(RADIXSERVE), "operator", "--liveness", health, env=env, cwd=str(tmp_path)
            )
            try:
                k8s = Cluster(api)
                await eventually(lambda: _healthy(health), "liveness endpoint", timeout=30)
                await k8s.create("chat", SMOLLM_CPU)
                for path in CHILDREN:
                    await eventually(lambda p=path: k8s.get(p), path)
                engine = await k8s.get(CHILDREN[4])
                image = engine["spec"]["template"]["spec"]["containers"][0]["image"]
                assert image == "registry.local/engine:dev"
            finally:
                proc.send_signal(signal.SIGTERM)
                code = await asyncio.wait_for(proc.wait(), 20)
            assert code == 0

    asyncio.run(scenario())
