"""Names the operator shares with the cluster (API group, labels, ports) and its settings.

Everything a deployer may change (default images, watched namespaces, resync period) lives
in `OperatorConfig`, read once from the environment by the startup handler; the rest are
constants because other components (router discovery, the chart's RBAC) rely on them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

GROUP = "radixserve.io"
VERSION = "v1alpha1"
PLURAL = "inferenceservices"
KIND = "InferenceService"
API_VERSION = f"{GROUP}/{VERSION}"

# Finalizer, progress and diff-base annotations all live under our own prefix.
FINALIZER = f"{GROUP}/finalizer"
ANNOTATION_PREFIX = GROUP

# Labels on every child; the selector subset never changes (Deployment selectors are immutable).
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_OWNER = f"{GROUP}/inferenceservice"
LABEL_ROLE = f"{GROUP}/role"  # prefill / decode engine pods (disaggregation)
APP_NAME = "radixserve"
MANAGED_BY = "radixserve-operator"

# Ports: the engine's HTTP API and KV-event stream (PUB on 5557, replay on 5558; DP rank r would
# publish on 5557 + 2r, the engine's `port_for_rank`), the router, and the user-facing Service.
ENGINE_HTTP_PORT = 30000
KV_EVENTS_PORT = 5557
ROUTER_PORT = 8000
SERVICE_PORT = 80

DEFAULT_ENGINE_IMAGE = "radixserve/engine:0.1.0"
DEFAULT_ROUTER_IMAGE = "radixserve/router:0.1.0"


@dataclass(frozen=True)
class OperatorConfig:
    engine_image: str = DEFAULT_ENGINE_IMAGE
    router_image: str = DEFAULT_ROUTER_IMAGE
    # Empty: every namespace (cluster-wide); else only these.
    namespaces: tuple[str, ...] = ()
    # Level-based safety net: children are re-checked at least this often even without events.
    resync_seconds: float = 60.0
    # Render a NetworkPolicy per InferenceService: engines reachable only from their router.
    network_policy: bool = False

    def __post_init__(self) -> None:
        if not self.engine_image:
            raise ValueError("engine_image: must not be empty")
        if not self.router_image:
            raise ValueError("router_image: must not be empty")
        if self.resync_seconds <= 0:
            raise ValueError(f"resync_seconds: must be > 0, got {self.resync_seconds}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        """RADIXSERVE_ENGINE_IMAGE, RADIXSERVE_ROUTER_IMAGE, RADIXSERVE_WATCH_NAMESPACES
        (comma-separated), RADIXSERVE_RESYNC_SECONDS, RADIXSERVE_NETWORK_POLICY (true|false)."""
        env = os.environ if env is None else env
        namespaces = env.get("RADIXSERVE_WATCH_NAMESPACES", "")
        resync = env.get("RADIXSERVE_RESYNC_SECONDS", "60")
        try:
            resync_seconds = float(resync)
        except ValueError:
            raise ValueError(f"RADIXSERVE_RESYNC_SECONDS: not a number: {resync!r}") from None
        policy = env.get("RADIXSERVE_NETWORK_POLICY", "false").strip().lower()
        if policy not in ("true", "false"):
            raise ValueError(f"RADIXSERVE_NETWORK_POLICY: expected true or false, got {policy!r}")
        return cls(
            engine_image=env.get("RADIXSERVE_ENGINE_IMAGE", DEFAULT_ENGINE_IMAGE),
            router_image=env.get("RADIXSERVE_ROUTER_IMAGE", DEFAULT_ROUTER_IMAGE),
            namespaces=tuple(n.strip() for n in namespaces.split(",") if n.strip()),
            resync_seconds=resync_seconds,
            network_policy=policy == "true",
        )
