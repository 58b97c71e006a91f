"""Command-line flags for ServerArgs, derived from its fields so each flag is defined once:
`--field-name` with the field's type and default; booleans are `--flag` switches."""

from __future__ import annotations

import argparse
import types
import typing
from dataclasses import MISSING, fields
from typing import Any

from radixserve.engine.configs.server_args import ServerArgs

_HELP = {
    "model_path": "HF folder, .gguf file, or alias (smollm2-135m)",
    "dtype": "float32 | bfloat16 | float16 | auto",
    "page_size": "tokens per KV page",
    "max_total_tokens": "KV pool size in tokens (default: from mem_fraction_static)",
    "chunked_prefill_size": "max tokens per prefill chunk (-1 disables)",
    "schedule_policy": "fcfs | lpm | dfs-weight | lof | random",
    "kv_events_port": "publish radix-tree KV events on this port (replay on port + 1)",
    "api_key": "require 'Authorization: Bearer KEY' on every endpoint but /health",
}


def _base_type(annotation: Any) -> type:
    hints = {"int": int, "float": float, "str": str, "bool": bool}
    if isinstance(annotation, str):  # `from __future__ import annotations`
        for name, t in hints.items():
            if annotation.startswith(name):
                return t
        return str
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) and args:
        return args[0]
    return annotation if isinstance(annotation, type) else str


def add_server_args(parser: argparse.ArgumentParser) -> None:
    for f in fields(ServerArgs):
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not MISSING else None
        typ = _base_type(f.type)
        if typ is bool:
            parser.add_argument(flag, action="store_true", default=default, help=_HELP.get(f.name))
        else:
            parser.add_argument(flag, type=typ, default=default, help=_HELP.get(f.name))


def server_args_from_namespace(ns: argparse.Namespace) -> ServerArgs:
    return ServerArgs(**{f.name: getattr(ns, f.name) for f in fields(ServerArgs)})
