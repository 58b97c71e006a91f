"""Parse a container's argv with the real `radixserve` command-line parser.

Images and rendered Deployments name `radixserve` subcommands and flags; parsing them with the
parser the container will run proves every subcommand and flag exists. A subcommand the CLI
does not have fails the caller naming the subcommand and where the argv came from (a typo in
a chart template or the Dockerfile would otherwise crash-loop the pod, not a test).
"""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest


def _subcommands(parser: argparse.ArgumentParser) -> set[str]:
    for action in parser._actions:  # argparse keeps its subparsers here; there is no public API
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


def _command_of(argv: list[str]) -> str:
    """The subcommand: the first word after the global options (only --log-level takes a value)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] == "--log-level" else 1
    return argv[i] if i < len(argv) else ""


def parse_cli(argv: list[str], source: str) -> argparse.Namespace:
    """`argv` parsed by the real parser; `source` says where it came from (a chart template
    and its values, a Dockerfile stage) for the failure message."""
    from radixserve.cli import build_parser

    parser = build_parser()
    command = _command_of(argv)
    known = _subcommands(parser)
    if command not in known:
        pytest.fail(
            f"{source}: `radixserve {command}` is no subcommand of radixserve.cli "
            f"(it has {', '.join(sorted(known))}); argv {argv}"
        )
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"{source}: radixserve rejects {argv}: {stderr.getvalue().strip()}")
