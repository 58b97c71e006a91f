"""The `radixserve` command line. Each subcommand imports its component lazily, so the
router and operator never pay for (or need) torch."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from radixserve.bench.cli import add_bench_parser
from radixserve.demo import add_demo_parser
from radixserve.local_stack import add_up_parser
from radixserve.logging_setup import LOG_LEVELS, NO_PROGRESS_ENV, configure_logging
from radixserve.operator_cli import add_operator_parser
from radixserve.router_cli import add_router_parser
from radixserve.serve_cli import add_serve_parser

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixserve", description=__doc__)
    parser.add_argument("--log-level", default="warning", choices=LOG_LEVELS)
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bars (model loading, benchmarks); they are off anyway when stderr "
        "is not a terminal",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_demo_parser(sub)
    add_bench_parser(sub)
    add_serve_parser(sub)
    add_operator_parser(sub)
    add_router_parser(sub)
    add_up_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.no_progress:  # inherited by the engine's child processes
        os.environ[NO_PROGRESS_ENV] = "1"
    try:  # each subcommand has --log-format (the engine's is a ServerArgs field)
        configure_logging(args.log_level, getattr(args, "log_format", "text"), args.command)
    except ValueError as exc:
        print(f"radixserve: error: {exc}", file=sys.stderr)
        return 2
    handler: Handler = args.handler
    try:
        return handler(args)
    except ValueError as exc:  # bad user input: one clear line, no traceback
        print(f"radixserve: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
