"""`radixserve up --prefill N --decode M`: a local PD stack, each replica's role flags and the
router's workers in sglang-router's PD shape, read back by the engine's and router's parsers."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from radixserve.local_stack import Replica, add_up_parser, roles, worker_flags


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_up_parser(parser.add_subparsers())
    return parser.parse_args(["up", *argv])


def test_up_pd_roles_and_router_flags_parse_as_the_router_reads_them() -> None:
    from radixserve.router.config import add_router_args, config_from_namespace

    args = _args("--prefill", "2", "--decode", "1")
    assert roles(args) == ["prefill", "prefill", "decode"]
    proc: Any = None  # no process: only the addresses are read
    replicas = [
        Replica(0, 30000, 5557, proc, Path("/dev/null"), "prefill", 8998),
        Replica(1, 30001, 5559, proc, Path("/dev/null"), "prefill", 8999),
        Replica(2, 30002, 5561, proc, Path("/dev/null"), "decode"),
    ]
    parser = argparse.ArgumentParser()
    add_router_args(parser)
    config = config_from_namespace(parser.parse_args(worker_flags(replicas)))
    assert config.pd_disaggregation
    assert config.prefill_bootstrap_ports == {
        "http://127.0.0.1:30000": 8998,
        "http://127.0.0.1:30001": 8999,
    }
    assert config.decode_urls == ("http://127.0.0.1:30002",)
    with pytest.raises(ValueError, match="both must be"):
        roles(_args("--prefill", "1"))
    assert roles(_args("--replicas", "2")) == [None, None]
