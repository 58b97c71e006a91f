"""`radixserve serve`: one engine replica with its HTTP API."""

from __future__ import annotations

import argparse
from typing import Any


def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run one engine replica (HTTP + scheduler + detokenizer)")
    from radixserve.engine.configs.cli_args import add_server_args  # engine extra (no torch)

    add_server_args(p)
    p.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from radixserve.engine.configs.cli_args import server_args_from_namespace

    server_args = server_args_from_namespace(args)  # validated before torch is imported
    from radixserve.engine.entrypoints.serve import serve  # engine extra: torch

    return serve(server_args)
