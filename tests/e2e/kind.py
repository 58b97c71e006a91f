"""Drive a kind cluster from tests: prerequisites, cluster, images, Helm release, port-forward.

Everything goes through the real command-line tools (kind, docker, kubectl, helm) with a
kubeconfig of our own, so the user's current kubectl context is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "radixserve"
KIND_VALUES = Path(__file__).with_name("values-kind.yaml")
TOOLS = ("kind", "docker", "kubectl", "helm")
TARGETS = ("engine", "router", "operator")
OPERATOR_NAMESPACE = "radixserve-system"
RELEASE = "radixserve"


def missing_prerequisites() -> list[str]:
    """What keeps the kind suite from running here, in words; empty when it can run."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    problems = [f"{', '.join(missing)} not on PATH"] if missing else []
    if "docker" not in missing:
        try:
            info = subprocess.run(
                ["docker", "info"], capture_output=True, text=True, timeout=30, check=False
            )
        except subprocess.TimeoutExpired:
            problems.append("`docker info` timed out")
        else:
            if info.returncode != 0:
                detail = (info.stderr or info.stdout).strip().splitlines()
                first = next((line for line in detail if line.strip()), "no output")
                problems.append(f"`docker info` failed ({first.strip()})")
    return problems


def run(
    cmd: list[str], *, timeout: float = 600, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO, check=False
    )
    if check and proc.returncode != 0:
        output = proc.stdout[-4000:] + proc.stderr[-4000:]
        raise AssertionError(f"`{' '.join(cmd)}` exited {proc.returncode}\n{output}")
    return proc


def wait_for(
    what: str, check: Callable[[], bool], timeout: float, describe: Callable[[], str] | None = None
) -> None:
    """Poll `check` until it is true; on timeout fail with `describe()` for the post-mortem."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(2)
    detail = describe() if describe else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{detail}")


@dataclass(frozen=True)
class Cluster:
    name: str
    kubeconfig: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        return run(["kubectl", *args], timeout=timeout, env=self.env, check=check).stdout

    def get(self, namespace: str, *what: str) -> dict[str, Any] | None:
        """One object (or a List) as JSON; None when it does not exist."""
        proc = run(
            ["kubectl", "get", "-n", namespace, *what, "-o", "json"],
            env=self.env,
            timeout=60,
            check=False,
        )
        if proc.returncode != 0:
            if "NotFound" in proc.stderr:
                return None
            raise AssertionError(f"kubectl get {' '.join(what)}: {proc.stderr.strip()}")
        return json.loads(proc.stdout)

    def diagnostics(self, namespace: str) -> str:
        """What a failing e2e run needs to be understood from its log alone."""
        parts = []
        commands = (
            ["get", "isvc,deploy,rs,pods,svc,endpointslices", "-n", namespace, "-o", "wide"],
            ["describe", "isvc", "-n", namespace],
            ["get", "events", "-n", namespace, "--sort-by=.lastTimestamp"],
            ["logs", "-n", OPERATOR_NAMESPACE, "deploy/" + RELEASE, "--tail=80"],
        )
        for args in commands:
            proc = run(["kubectl", *args], env=self.env, timeout=60, check=False)
            parts.append(f"$ kubectl {' '.join(args)}\n{proc.stdout}{proc.stderr}")
        return "\n".join(parts)


def ensure_cluster(name: str, kubeconfig: Path) -> tuple[Cluster, bool]:
    """Reuse the kind cluster `name` if it exists, else create it; says whether it created it."""
    existing = run(["kind", "get", "clusters"], timeout=60).stdout.split()
    created = name not in existing
    if created:
        cmd = ["kind", "create", "cluster", "--name", name, "--kubeconfig", str(kubeconfig)]
        node_image = os.environ.get("RADIXSERVE_E2E_NODE_IMAGE")
        run([*cmd, "--wait", "180s", *(["--image", node_image] if node_image else [])], timeout=600)
    else:
        config = run(["kind", "get", "kubeconfig", "--name", name], timeout=60).stdout
        kubeconfig.write_text(config)
    return Cluster(name=name, kubeconfig=kubeconfig), created


def image_name(target: str, tag: str) -> str:
    return f"radixserve/{target}:{tag}"


def build_and_load_images(cluster: Cluster, tag: str) -> None:
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    for target in TARGETS:
        image = image_name(target, tag)
        run(["docker", "build", "--target", target, "-t", image, str(REPO)], timeout=3600, env=env)
        run(["kind", "load", "docker-image", image, "--name", cluster.name], timeout=900)


def helm_sets(tag: str) -> list[str]:
    """`--set` values on top of values-kind.yaml: every image at the tag built for this run."""
    return [f"image.tag={tag}", *(f"defaultImages.{t}.tag={tag}" for t in ("engine", "router"))]


def helm_install(cluster: Cluster, tag: str) -> None:
    sets = helm_sets(tag)
    cmd = ["helm", "upgrade", "--install", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE]
    cmd += ["--create-namespace", "--wait", "--timeout", "5m", "-f", str(KIND_VALUES)]
    for value in sets:
        cmd += ["--set", value]
    run(cmd, env=cluster.env, timeout=400)


def delete_cluster(cluster: Cluster) -> None:
    run(["kind", "delete", "cluster", "--name", cluster.name], timeout=300, check=False)


@contextlib.contextmanager
def port_forward(cluster: Cluster, namespace: str, service: str, port: int) -> Iterator[int]:
    """`kubectl port-forward svc/<service> :<port>`; yields the local port."""
    cmd = ["kubectl", "port-forward", "-n", namespace, f"svc/{service}", f":{port}"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cluster.env
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        local = None
        while local is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                raise AssertionError(f"port-forward to svc/{service} exited {proc.returncode}")
            match = re.search(r"Forwarding from 127\.0\.0\.1:(\d+)", line)
            local = int(match[1]) if match else None
        assert local is not None, f"port-forward to svc/{service} did not start"
        yield local
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if proc.poll() is None:
            proc.kill()
