"""Command-line flags of `radixserve serve`: one per ServerArgs field, built from the fields'
metadata by radixserve.config_options (the router's flags come from the same builder)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from radixserve.config_options import add_dataclass_args, namespace_values
from radixserve.engine.configs.server_args import ServerArgs


def add_server_args(parser: argparse.ArgumentParser) -> None:
    add_dataclass_args(parser, ServerArgs)


def server_args_from_namespace(
    ns: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> ServerArgs:
    """ServerArgs from the parsed flags; `--api-key` falls back to $RADIXSERVE_API_KEY."""
    return ServerArgs(**namespace_values(ServerArgs, ns, environ))
