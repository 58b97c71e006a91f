"""radixserve.config_options: a config dataclass's fields as argparse flags, parsed by argparse
itself (the oracle), and back into the config."""

from __future__ import annotations

import argparse
import dataclasses
import typing

import pytest

from radixserve.config_options import (
    NOT_A_FLAG,
    add_dataclass_args,
    check_choices,
    flag_choices,
    flag_type,
    namespace_values,
    option,
)


@dataclasses.dataclass(frozen=True)
class Sample:
    size: int = option(4, "how many")
    ratio: float | None = option(None, "a share")
    mode: str = option("fast", "how", choices=("fast", "slow"))
    urls: tuple[str, ...] = option((), "where", nargs="*")
    dry_run: bool = option(False, "do nothing")
    token: str | None = option(None, "a secret", env="SAMPLE_TOKEN", repr=False)
    extra: dict[str, int] = dataclasses.field(default_factory=dict, metadata=NOT_A_FLAG)

    def __post_init__(self) -> None:
        check_choices(self)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_dataclass_args(parser, Sample)
    return parser


def test_fields_become_flags_and_parse_back() -> None:
    ns = _parser().parse_args(
        ["--size", "8", "--ratio", "0.5", "--mode", "slow", "--urls", "a", "b", "--dry-run"]
    )
    values = namespace_values(Sample, ns, {})
    assert Sample(**values) == Sample(8, 0.5, "slow", ("a", "b"), True, None)
    assert "extra" not in values and not hasattr(ns, "extra")


def test_defaults_are_the_fields_defaults() -> None:
    assert Sample(**namespace_values(Sample, _parser().parse_args([]), {})) == Sample()


def test_env_fills_an_unset_flag_only() -> None:
    parser = _parser()
    env = {"SAMPLE_TOKEN": "from-env"}
    assert namespace_values(Sample, parser.parse_args([]), env)["token"] == "from-env"
    assert namespace_values(Sample, parser.parse_args([]), {"SAMPLE_TOKEN": ""})["token"] is None
    given = parser.parse_args(["--token", "from-flag"])
    assert namespace_values(Sample, given, env)["token"] == "from-flag"
    assert "from-env" not in repr(Sample(token="from-env"))


def test_help_says_where_a_secret_comes_from() -> None:
    token = next(a for a in _parser()._actions if a.dest == "token")
    assert token.help == "a secret (default: $SAMPLE_TOKEN, which keeps it off the command line)"


def test_choices_are_offered_and_checked(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["--mode", "medium"])
    assert "argument --mode: invalid choice: 'medium'" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"^mode: must be one of fast, slow, got 'medium'$"):
        Sample(mode="medium")
    assert flag_choices(Sample) == {"--mode": ["fast", "slow"]}


def test_a_field_without_help_is_refused() -> None:
    @dataclasses.dataclass
    class Silent:
        quiet: int = 0

    with pytest.raises(TypeError, match="^quiet: a flag needs help"):
        add_dataclass_args(argparse.ArgumentParser(), Silent)


@pytest.mark.parametrize(
    ("hint", "expected"),
    [
        (int, int),
        (int | None, int),
        (typing.Optional[float], float),  # noqa: UP045 - the spelling under test
        (bool, bool),
        (str | None, str),
        (int | str, str),
        (list[int], str),
    ],
)
def test_flag_type_of_resolved_annotations(hint: object, expected: type) -> None:
    assert flag_type(hint) is expected
