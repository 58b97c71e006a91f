"""Every flag of `radixserve serve` and `radixserve router` says what it does in --help: each
config field gets a flag, and each flag a help text (the engine's covered 25 of 49 fields, the
router's 14 of 38, before this test)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from radixserve.engine.configs.cli_args import add_server_args
from radixserve.router.config import add_router_args

BUILDERS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "serve": add_server_args,
    "router": add_router_args,
}


@pytest.mark.parametrize("builder", list(BUILDERS.values()), ids=list(BUILDERS))
def test_every_flag_has_help(builder: Callable[[argparse.ArgumentParser], None]) -> None:
    parser = argparse.ArgumentParser()
    builder(parser)
    flags = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert flags
    silent = [a.option_strings[0] for a in flags if not (a.help and a.help.strip())]
    assert not silent, f"flags without help: {silent}"
