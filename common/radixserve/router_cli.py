"""`radixserve router`: the cache-aware router in front of engine servers (no torch)."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from radixserve.http_protocol import header_timeout_protocol
from radixserve.logging_setup import RequestIdMiddleware, add_logging_args, status_line


def add_router_parser(sub: Any) -> None:
    from radixserve.router.config import add_router_args

    help_text = "run the cache-aware router in front of engine servers (its workers)"
    p = sub.add_parser("router", help=help_text)
    add_router_args(p)
    add_logging_args(p)
    p.set_defaults(handler=run_router)


def run_router(args: argparse.Namespace) -> int:
    import uvicorn

    from radixserve.router.app import create_app
    from radixserve.router.config import config_from_namespace

    config = config_from_namespace(args)
    if args.log_level != "debug":  # one line per proxied request is the access log's job
        logging.getLogger("httpx").setLevel(logging.WARNING)
    if not (config.worker_urls or config.k8s_service or config.pd_disaggregation):
        status_line(
            "radixserve router: no --worker-urls or --k8s-service: add workers via POST /workers"
        )
    app = create_app(config)
    app.add_middleware(RequestIdMiddleware)  # outermost: every record of a request has its id
    # log_config=None: uvicorn's records go to our root handler, in --log-format
    uvicorn.run(
        app,
        host=config.host,
        port=config.port,
        log_level=args.log_level,
        log_config=None,
        # a connection that never sends its headers is closed; httptools parses in C
        http=header_timeout_protocol(config.header_timeout_s, parser="httptools"),
        loop="uvloop",
    )
    return 0
