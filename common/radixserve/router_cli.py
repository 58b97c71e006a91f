"""`radixserve router`: the cache-aware router in front of engine replicas (no torch)."""

from __future__ import annotations

import argparse
import logging
from typing import Any


def add_router_parser(sub: Any) -> None:
    from radixserve.router.config import add_router_args

    p = sub.add_parser("router", help="run the cache-aware router in front of engine replicas")
    add_router_args(p)
    p.set_defaults(handler=run_router)


def run_router(args: argparse.Namespace) -> int:
    import uvicorn

    from radixserve.router.app import create_app
    from radixserve.router.config import config_from_namespace

    config = config_from_namespace(args)
    if args.log_level != "debug":  # one line per proxied request is the access log's job
        logging.getLogger("httpx").setLevel(logging.WARNING)
    if not config.worker_urls and not config.k8s_service:
        print("radixserve router: no --worker-urls or --k8s-service: add workers via POST /workers")
    app = create_app(config)
    uvicorn.run(app, host=config.host, port=config.port, log_level=args.log_level)
    return 0
