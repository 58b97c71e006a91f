"""Parse a container's argv with the real `radixserve` command-line parser.

Images and rendered Deployments name `radixserve` subcommands and flags; parsing them with the
parser the container will run proves every flag exists. A subcommand another component has not
registered yet skips the caller with that reason instead of failing it.
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


def parse_cli(argv: list[str]) -> argparse.Namespace:
    from radixserve.cli import build_parser

    parser = build_parser()
    command = _command_of(argv)
    if command not in _subcommands(parser):
        pytest.skip(f"`radixserve {command}` is not registered in radixserve.cli yet")
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"radixserve rejects {argv}: {stderr.getvalue().strip()}")
