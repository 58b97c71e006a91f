"""`make image-check`: build the three images for real, check them, and serve a chat with them.

1. A Docker daemon: the one running, else Debian's `dockerd --bridge=none --iptables=false`
   started here (and stopped at the end); containers then use the host network.
2. The base image (BASE_IMAGE, default radixserve/python:3.11-bookworm): when missing, made
   from Debian itself where no registry is reachable: debootstrap bookworm (minbase +
   python3.11 + python3-venv), a venv at /opt/venv on PATH, the build machine's extra CA
   certificates (so pip inside the build trusts what the host trusts), `docker import`.
3. The torch wheel: a local torch-<TORCH_VERSION>*.whl (TORCH_WHEEL, or pip's find-links
   folder /opt/wheels) is hard-linked into docker-wheels/, so the engine image installs it
   instead of downloading from TORCH_INDEX_URL.
4. Builds engine, router and operator (BuildKit, layer cache kept between runs), then checks
   each runs as uid 10001 and that router and operator hold no torch; reports sizes.
5. Runs an engine and a router container on the host network, hardened as in Kubernetes
   (read-only root, tmpfs scratch, no capabilities, no new privileges), with an API key passed
   through the environment, and chats through the router with the openai client: the answer
   must equal the engine's own greedy answer, a call without the key must get 401, and
   neither container's log may hold the key.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai

from tests.ports import free_port, free_port_pair

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = os.environ.get("BASE_IMAGE", "radixserve/python:3.11-bookworm")
TAG = os.environ.get("IMAGE_TAG", "dev")
TORCH_VERSION = os.environ.get("TORCH_VERSION", "2.13.0")
TARGETS = ("router", "operator", "engine")
UID = "10001"
MODEL = "smollm2-135m"
START_TIMEOUT_S = 300
HARDENED = [
    "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
    "--tmpfs", f"/tmp:rw,exec,size=1g,uid={UID},gid={UID}",
    "--tmpfs", f"/home/radixserve/.cache:rw,exec,size=1g,uid={UID},gid={UID}",  # kernels .so
]  # fmt: skip
NO_TORCH = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)"
HAS_TORCH = "import torch; print(torch.__version__)"
# The CPU kernels build (g++ in the image) into the cache a pod mounts writable (~/.cache)
HAS_KERNELS = (
    "from radixserve.kernels.cpu.paged_attention import load_paged_attention; "
    "from radixserve.kernels.cpu.fused_ops import load_fused_ops; "
    "import sys; sys.exit(load_paged_attention() is None or load_fused_ops() is None)"
)


def step(message: str) -> None:
    print(f"[image-check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(cmd: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    out = subprocess.run(list(cmd), check=True, capture_output=True, text=True, env=env)
    return out.stdout.strip()


def docker_client() -> list[str]:
    """A client that builds with BuildKit: `docker` with buildx, else Debian's own client
    (docker.io ships BuildKit in the 20.10 client)."""
    if subprocess.run(["docker", "buildx", "version"], capture_output=True).returncode == 0:
        return ["docker"]
    if Path("/usr/bin/docker").exists():
        return ["/usr/bin/docker"]
    return ["docker"]


@contextmanager
def daemon(docker: list[str]) -> Iterator[None]:
    if subprocess.run([*docker, "info"], capture_output=True).returncode == 0:
        yield
        return
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        sys.exit("image-check: no Docker daemon and no dockerd (apt-get install docker.io)")
    step("starting dockerd --bridge=none --iptables=false")
    log = open("/tmp/radixserve-image-check-dockerd.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [dockerd, "--bridge=none", "--iptables=false"], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        for _ in range(60):
            if subprocess.run([*docker, "info"], capture_output=True).returncode == 0:
                break
            time.sleep(1)
        else:
            sys.exit(
                "image-check: dockerd did not come up (/tmp/radixserve-image-check-dockerd.log)"
            )
        yield
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()


def image_exists(docker: list[str], image: str) -> bool:
    return subprocess.run([*docker, "image", "inspect", image], capture_output=True).returncode == 0


def make_base_image(docker: list[str]) -> None:
    if image_exists(docker, BASE_IMAGE):
        step(f"base image {BASE_IMAGE}: present")
        return
    if shutil.which("debootstrap") is None:
        sys.exit("image-check: no base image and no debootstrap (apt-get install debootstrap)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="radixserve-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        step(f"base image {BASE_IMAGE}: debootstrap bookworm (minbase + python3.11) …")
        include = "--include=python3.11,python3-venv,python3-pip,ca-certificates"
        subprocess.run(
            ["debootstrap", "--variant=minbase", include, "bookworm", str(root)], check=True
        )
        subprocess.run(["chroot", str(root), "python3", "-m", "venv", "/opt/venv"], check=True)
        extra = Path("/usr/local/share/ca-certificates")
        for cert in extra.glob("*.crt") if extra.is_dir() else ():
            shutil.copy(cert, root / "usr/local/share/ca-certificates" / cert.name)
        subprocess.run(
            ["chroot", str(root), "update-ca-certificates"], check=True, capture_output=True
        )
        for junk in (
            "var/cache/apt/archives",
            "var/lib/apt/lists",
            "usr/share/doc",
            "usr/share/man",
        ):
            shutil.rmtree(root / junk, ignore_errors=True)
        path = "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(
            [*docker, "import", "--change", f"ENV PATH={path}", "--change", "ENV LANG=C.UTF-8",
             "--change", 'CMD ["python3"]', "-", BASE_IMAGE],
            stdin=tar.stdout, check=True, capture_output=True,
        )  # fmt: skip
        tar.wait()
    step(f"base image {BASE_IMAGE}: imported in {time.monotonic() - started:.0f} s")


def link_torch_wheel() -> None:
    folder = REPO / "docker-wheels"
    if list(folder.glob(f"torch-{TORCH_VERSION}*.whl")):
        step("torch wheel: already in docker-wheels/")
        return
    given = os.environ.get("TORCH_WHEEL")
    found = (
        [Path(given)] if given else sorted(Path("/opt/wheels").glob(f"torch-{TORCH_VERSION}*.whl"))
    )
    if not found:
        step(f"torch wheel: none on disk, the build downloads torch {TORCH_VERSION}")
        return
    target = folder / found[0].name
    try:
        os.link(found[0], target)
    except OSError:
        shutil.copy(found[0], target)
    step(f"torch wheel: {found[0]} -> docker-wheels/")


def build(docker: list[str]) -> dict[str, float]:
    seconds: dict[str, float] = {}
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    for target in TARGETS:
        step(f"building {target} (radixserve/{target}:{TAG}) …")
        started = time.monotonic()
        cmd = [
            *docker, "build", "--network", "host", "--progress", "plain",
            "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
            "--build-arg", f"TORCH_VERSION={TORCH_VERSION}",
            "--target", target, "-t", f"radixserve/{target}:{TAG}", str(REPO),
        ]  # fmt: skip
        log = Path(f"/tmp/radixserve-image-check-build-{target}.log")
        with open(log, "wb") as out:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
        if rc:
            sys.exit(f"image-check: build of {target} failed:\n{log.read_text()[-4000:]}")
        seconds[target] = time.monotonic() - started
        step(f"built {target} in {seconds[target]:.0f} s (log {log})")
    return seconds


def check_image(docker: list[str], target: str) -> int:
    image = f"radixserve/{target}:{TAG}"
    user = run([*docker, "image", "inspect", "-f", "{{.Config.User}}", image])
    uid = run([*docker, "run", "--rm", "--entrypoint", "id", image, "-u"])
    assert user == f"{UID}:{UID}" and uid == UID, f"{image}: runs as {user!r} / uid {uid}"
    python = [*docker, "run", "--rm", "--read-only", "--entrypoint", "python", image, "-c"]
    if target == "engine":
        version = run([*python, HAS_TORCH])
        assert version.startswith(TORCH_VERSION), f"{image}: torch {version}"
        cache = ["--tmpfs", f"/home/radixserve/.cache:rw,exec,uid={UID},gid={UID}"]
        kernels = [*docker, "run", "--rm", "--read-only", *cache, "--entrypoint", "python"]
        built = subprocess.run([*kernels, image, "-c", HAS_KERNELS])
        assert built.returncode == 0, f"{image}: the CPU kernels did not build"
    else:
        assert subprocess.run([*python, NO_TORCH]).returncode == 0, f"{image} holds torch"
    run([*docker, "run", "--rm", "--read-only", image, "--help"])  # the CLI starts
    size = int(run([*docker, "image", "inspect", "-f", "{{.Size}}", image]))
    step(f"{image}: uid {uid}, {'torch ' + TORCH_VERSION if target == 'engine' else 'no torch'}, "
         f"{size / 2**20:.0f} MiB")  # fmt: skip
    return size


def wait_ready(url: str, container: str, docker: list[str], headers: dict[str, str]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        state = run([*docker, "inspect", "-f", "{{.State.Running}}", container])
        if state != "true":
            sys.exit(f"image-check: {container} exited:\n{run([*docker, 'logs', container])}")
        try:
            if httpx.get(url, headers=headers, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    sys.exit(f"image-check: {url} not ready")


def chat(base: str, key: str) -> str:
    client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name three colours."}],
        max_tokens=16, temperature=0,
    )  # fmt: skip
    return out.choices[0].message.content or ""


def serve_and_chat(docker: list[str]) -> None:
    key = f"ic-{secrets.token_hex(12)}"
    engine_port, router_port, kv_port = free_port(), free_port(), free_port_pair()
    engine, router = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{router_port}"
    names = [f"radixserve-ic-engine-{engine_port}", f"radixserve-ic-router-{router_port}"]
    common = [*docker, "run", "-d", "--network", "host", *HARDENED]
    try:
        step(f"engine container on {engine} (hardened, key from the environment) …")
        run([*common, "--name", names[0], "--shm-size", "1g", "-e", "RADIXSERVE_API_KEY",
             "-e", "OMP_NUM_THREADS=2", f"radixserve/engine:{TAG}", "serve", "--model-path", MODEL,
             "--host", "127.0.0.1", "--port", str(engine_port), "--kv-events-port", str(kv_port),
             "--max-total-tokens", "4096"],
            env={**os.environ, "RADIXSERVE_API_KEY": key})  # fmt: skip
        wait_ready(engine + "/health", names[0], docker, {})
        step(f"router container on {router} …")
        router_env = {"RADIXSERVE_ROUTER_API_KEY": key, "RADIXSERVE_ROUTER_WORKER_API_KEY": key}
        run([*common, "--name", names[1], "-e", "RADIXSERVE_ROUTER_API_KEY",
             "-e", "RADIXSERVE_ROUTER_WORKER_API_KEY", f"radixserve/router:{TAG}", "router",
             "--host", "127.0.0.1", "--port", str(router_port), "--worker-urls", engine],
            env={**os.environ, **router_env})  # fmt: skip
        wait_ready(router + "/readiness", names[1], docker, {})
        step("chatting through the router (openai client) …")
        via_router = chat(router, key)
        direct = chat(engine, key)
        assert via_router and via_router == direct, (via_router, direct)
        try:
            chat(router, "wrong")
            raise AssertionError("the router served a request without the API key")
        except openai.AuthenticationError:
            pass
        step(f"router answered {via_router!r} (= the engine's own greedy answer); 401 without key")
        for name in names:
            logs = subprocess.run([*docker, "logs", name], capture_output=True, text=True)
            assert key not in logs.stdout + logs.stderr, f"{name}'s log holds the API key"
        step("neither container's log holds the key")
    finally:
        subprocess.run([*docker, "rm", "-f", *names], capture_output=True)


def main() -> int:
    docker = docker_client()
    started = time.monotonic()
    with daemon(docker):
        make_base_image(docker)
        link_torch_wheel()
        seconds = build(docker)
        sizes = {target: check_image(docker, target) for target in TARGETS}
        serve_and_chat(docker)
    print("\n| image | size | build |\n|---|---|---|")
    for target in TARGETS:
        size = f"{sizes[target] / 2**20:.0f} MiB"
        print(f"| radixserve/{target}:{TAG} | {size} | {seconds[target]:.0f} s |")
    step(f"passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
