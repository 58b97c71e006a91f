"""`radixserve operator`: run the InferenceService operator (kopf; no torch)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from typing import Any

from radixserve.logging_setup import add_logging_args


def add_operator_parser(sub: Any) -> None:
    p = sub.add_parser("operator", help="run the Kubernetes operator for InferenceServices")
    p.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable; default: $RADIXSERVE_WATCH_NAMESPACES, "
        "else every namespace)",
    )
    p.add_argument("--engine-image", help="default engine image ($RADIXSERVE_ENGINE_IMAGE)")
    p.add_argument("--router-image", help="default router image ($RADIXSERVE_ROUTER_IMAGE)")
    p.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        help="kopf's health endpoint for the pod's probes ('' disables)",
    )
    add_logging_args(p)
    p.set_defaults(handler=run_operator)


def run_operator(args: argparse.Namespace) -> int:
    import asyncio

    import kopf

    from radixserve.operator.config import OperatorConfig
    from radixserve.operator.handlers import register

    config = OperatorConfig.from_env()
    config = dataclasses.replace(
        config,
        namespaces=tuple(args.namespace) or config.namespaces,
        engine_image=args.engine_image or config.engine_image,
        router_image=args.router_image or config.router_image,
    )
    registry = kopf.OperatorRegistry()
    register(registry, config)
    # standalone: one replica (the chart runs one, Recreate) needs no peering CRD.
    # Ctrl-C before kopf's own signal handlers are up is a clean stop too, not a traceback.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            kopf.operator(
                registry=registry,
                standalone=True,
                clusterwide=not config.namespaces,
                namespaces=config.namespaces,
                liveness_endpoint=args.liveness or None,
            )
        )
    return 0
