"""Config dataclass fields that are also command-line flags: one argparse builder for the
engine's ServerArgs and the router's RouterConfig.

A field declared with `option(default, help, choices=..., env=...)` is the flag `--field-name`
(dashes for underscores) with the type of its annotation (`int | None` is `int`; anything but
one scalar is parsed as a string), its default, its help and its choices; booleans are
`--flag` switches. So a flag, its field, its help and its allowed values are written once, and
`add_dataclass_args` refuses a field that has no help. A field that is no flag says so with
`metadata=NOT_A_FLAG`. Torch-free and importing nothing of ours: the router uses it too.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
NOT_A_FLAG: Mapping[str, Any] = types.MappingProxyType({"flag": False})
_SCALARS = (bool, int, float, str)


def option(
    default: T,
    help: str,
    *,
    choices: Sequence[str] = (),
    env: str | None = None,
    nargs: str | None = None,
    repr: bool = True,
) -> T:
    """A dataclass field (`default`) that is the flag `--field-name`. `choices`: the values
    the flag and the config accept (`check_choices`); `env`: the variable read when the flag is
    not given (secrets, which Kubernetes hands over as env vars, off the command line);
    `nargs`: argparse's, for a tuple of strings."""
    metadata = {"help": help, "choices": tuple(choices), "env": env, "nargs": nargs}
    return dataclasses.field(default=default, repr=repr, metadata=metadata)


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def flag_type(hint: Any) -> type:
    """The argparse type of a resolved field annotation: `int | None` and `Optional[int]` are
    `int`; anything that is not one scalar (after dropping None) is parsed as a string."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else str
    return hint if hint in _SCALARS else str


def flag_fields(cls: type[DataclassInstance]) -> list[dataclasses.Field[Any]]:
    """The fields of dataclass `cls` that are flags, in declaration order."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("flag", True)]


def flag_help(f: dataclasses.Field[Any]) -> str:
    """The field's help as --help shows it; TypeError for a flag without help."""
    text = f.metadata.get("help", "").strip()
    if not text:
        raise TypeError(f"{f.name}: a flag needs help (declare the field with option())")
    env = f.metadata.get("env")
    return f"{text} (default: ${env}, which keeps it off the command line)" if env else text


def add_dataclass_args(parser: argparse.ArgumentParser, cls: type[DataclassInstance]) -> None:
    """One flag per flag field of dataclass `cls` (see the module docstring)."""
    hints = typing.get_type_hints(cls)
    for f in flag_fields(cls):
        default = None if f.default is dataclasses.MISSING else f.default
        kwargs: dict[str, Any] = {"default": default, "help": flag_help(f)}
        kind = flag_type(hints[f.name])
        if kind is bool:
            parser.add_argument(flag_name(f.name), action="store_true", **kwargs)
            continue
        if f.metadata.get("choices"):
            kwargs["choices"] = f.metadata["choices"]
        if f.metadata.get("nargs"):
            kwargs["nargs"] = f.metadata["nargs"]
        parser.add_argument(flag_name(f.name), type=kind, **kwargs)


def namespace_values(
    cls: type[DataclassInstance], ns: argparse.Namespace, environ: Mapping[str, str]
) -> dict[str, Any]:
    """The flag fields of `cls` that `ns` holds, as keyword arguments of `cls` (a list of
    nargs values as a tuple); a field with an `env` that was not given falls back to that
    variable (an empty one counts as unset)."""
    values: dict[str, Any] = {}
    for f in flag_fields(cls):
        if not hasattr(ns, f.name):
            continue
        value = getattr(ns, f.name)
        if isinstance(value, list):  # nargs: the field is a tuple
            value = tuple(value)
        env = f.metadata.get("env")
        values[f.name] = (environ.get(env) or None) if value is None and env else value
    return values


def flag_choices(cls: type[DataclassInstance]) -> dict[str, list[str]]:
    """`{"--flag": [choices]}` for every flag field of `cls` that has choices."""
    return {
        flag_name(f.name): list(f.metadata["choices"])
        for f in flag_fields(cls)
        if f.metadata.get("choices")
    }


def check_choices(config: DataclassInstance) -> None:
    """ValueError naming the first field of dataclass instance `config` whose value is not one
    of its choices (None, an optional flag left unset, is always allowed)."""
    for f in flag_fields(type(config)):
        choices = f.metadata.get("choices")
        value = getattr(config, f.name)
        if choices and value is not None and value not in choices:
            raise ValueError(f"{f.name}: must be one of {', '.join(choices)}, got {value!r}")
