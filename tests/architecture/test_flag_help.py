"""Every flag of `radixserve serve` and `radixserve router` says what it does in --help, and the
text is the config field's own: each field of ServerArgs and RouterConfig carries non-empty
help in its metadata (radixserve.config_options), and the real --help output shows every flag
of the subcommand with a help text, the fields' flags with theirs (the engine's covered 25 of
49 fields, the router's 14 of 38, before the first version of this test)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from radixserve.cli import build_parser, main
from radixserve.config_options import flag_fields, flag_help, flag_name
from radixserve.engine.configs.server_args import ServerArgs
from radixserve.router.config import RouterConfig

CONFIGS: dict[str, type] = {"serve": ServerArgs, "router": RouterConfig}
NOT_FLAGS = {
    "serve": set(),
    # RouterConfig.extra: for embedding callers; the PD pools: --prefill URL [PORT] and --decode
    # URL, added by add_router_args (a flag of one or two values)
    "router": {"extra", "prefill_urls", "prefill_bootstrap_ports", "decode_urls"},
}


@pytest.mark.parametrize("command", list(CONFIGS))
def test_every_config_field_is_a_flag_with_help(command: str) -> None:
    cls = CONFIGS[command]
    flags = {f.name for f in flag_fields(cls)}
    assert {f.name for f in dataclasses.fields(cls)} - flags == NOT_FLAGS[command]
    silent = [f.name for f in flag_fields(cls) if not str(f.metadata.get("help", "")).strip()]
    assert not silent, f"{cls.__name__} fields without help: {silent}"


def _subparser(command: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = sub.choices[command]
    return parser


def _shown_help(text: str) -> dict[str, str]:
    """`{first option string: its help}` from the options section of a --help output: an
    entry is `  --flag METAVAR  help` or `  --flag METAVAR` with the help on indented lines."""
    shown: dict[str, str] = {}
    current = None
    for line in text.split("options:", 1)[1].splitlines():
        if line.startswith("  -"):
            invocation, _, rest = line.strip().partition("  ")
            current = invocation.split()[0].rstrip(",")
            shown[current] = rest.strip()
        elif current is not None and line.strip():
            shown[current] = f"{shown[current]} {line.strip()}".strip()
    return shown


def _squeezed(text: str) -> str:
    return "".join(text.split())  # argparse wraps lines, also at the hyphens of words


@pytest.mark.parametrize("command", list(CONFIGS))
def test_help_output_shows_every_flag_with_its_help(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    shown = _shown_help(capsys.readouterr().out)
    flags = [a.option_strings[0] for a in _subparser(command)._actions if a.dest != "help"]
    assert flags and set(flags) <= set(shown)
    silent = [flag for flag in flags if not shown[flag]]
    assert not silent, f"radixserve {command} --help shows no help for {silent}"
    for f in flag_fields(CONFIGS[command]):
        assert _squeezed(shown[flag_name(f.name)]) == _squeezed(flag_help(f)), f.name
