"""`radixserve serve`: one engine replica with its HTTP API."""

from __future__ import annotations

import argparse
from typing import Any

from radixserve.logging_setup import status_line


def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run one engine replica (HTTP + scheduler + detokenizer)")
    from radixserve.engine.configs.cli_args import add_server_args  # engine extra (no torch)

    add_server_args(p)
    p.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from radixserve.engine.configs.cli_args import server_args_from_namespace

    server_args = server_args_from_namespace(args)  # validated before torch is imported
    from radixserve.engine.entrypoints.launch import start_subprocesses  # no torch

    status_line(f"radixserve: loading {server_args.model_path} …")
    # The children start first: their imports and model load overlap the parent's imports of
    # torch and the HTTP stack below (~2 s of a ~6.5 s start on 2 cores).
    started = start_subprocesses(server_args)
    try:
        from radixserve.engine.entrypoints.serve import serve  # engine extra: torch
    except BaseException:
        started.children.shutdown()
        raise
    return serve(server_args, started)
