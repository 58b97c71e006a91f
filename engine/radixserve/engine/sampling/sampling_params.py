"""Per-request sampling parameters: names, defaults, parsing, validation and normalisation.

Owns `SamplingParams`, the one place that knows SGLang's parameter names, their defaults, the
types a request may give for them and the ranges they must fall in. It holds no tensors; turning a
batch of parameters into tensors is `sampling_batch_info`'s job. Runs wherever a request is
validated (the HTTP process, the offline engine) and in the scheduler process.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any

import msgspec

# Below this temperature the distribution is treated as a point mass (SGLang's threshold).
_GREEDY_TEMPERATURE = 1e-6

# Per-field types and ranges, checked by `msgspec.convert`. Its range checks reject NaN (which
# fails every comparison). Rules that an annotated type cannot state are in `_check_rules`.
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
TokenId = Annotated[int, msgspec.Meta(ge=0)]
Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
Probability = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


@dataclass(slots=True)
class SamplingParams:
    """How one request's next tokens are chosen and when its generation stops."""

    max_new_tokens: NonNegativeInt = 128
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0)] = 1.0
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 1.0
    top_k: int = -1  # -1 means the whole vocabulary
    min_p: Probability = 0.0
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    repetition_penalty: Annotated[float, msgspec.Meta(gt=0.0, le=2.0)] = 1.0
    min_new_tokens: NonNegativeInt = 0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: Annotated[int, msgspec.Meta(ge=1)] = 1
    sampling_seed: int | None = None  # None: a fresh random generator; an int reproduces exactly
    logit_bias: dict[TokenId, float] | None = None
    # Constrained decoding (at most one): a JSON schema as JSON text, a regular expression, an
    # EBNF grammar (GBNF-style, xgrammar's dialect), an xgrammar structural tag as JSON text.
    # Their syntax is checked at the edge by `constrained.check_grammar`.
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> SamplingParams:
        """Build from a request's JSON object; raise ValueError, its message starting with the
        field name, on an unknown key, a value of the wrong type or a value out of range.

        Strict types: a bool is not a number, a float is not an integer, a string is not a
        number; an integer widens to a float. `logit_bias` keys may be JSON strings ("50256").
        Only the vocabulary bound of token ids is left to `verify`, which needs the vocabulary.
        """
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise ValueError(f"sampling_params: expected an object, got {type(d).__name__}")
        for key in d:
            if key not in _FIELD_NAMES:
                raise ValueError(f"unknown sampling parameter {key!r}")
        params = _convert(d)
        params._check_rules()
        return params

    @property
    def is_greedy(self) -> bool:
        """Whether the argmax is always taken (true before and after `normalize`)."""
        return self.top_k == 1 or self.temperature < _GREEDY_TEMPERATURE

    @property
    def has_grammar(self) -> bool:
        """Whether the output is constrained (json_schema, regex, ebnf or structural_tag)."""
        return any(getattr(self, g) is not None for g in GRAMMAR_FIELDS)

    @property
    def stop_strs(self) -> list[str]:
        if self.stop is None:
            return []
        if isinstance(self.stop, str):
            return [self.stop]
        return list(self.stop)

    def normalize(self) -> None:
        """Put equivalent settings into one canonical form; safe to call more than once."""
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        # A (near-)zero temperature is the greedy limit; SGLang spells it top_k=1 at temperature 1
        # so that no later step divides by ~0.
        if self.temperature < _GREEDY_TEMPERATURE:
            self.top_k = 1
            self.temperature = 1.0

    def verify(self, vocab_size: int | None = None) -> None:
        """Raise ValueError, its message starting with the field name, on an out-of-range value.

        Checks what `from_dict` checks (an instance may have been built directly), and with
        `vocab_size` also that every token id is below it.
        """
        _convert({name: getattr(self, name) for name in _FIELD_NAMES})  # shallow: read only
        self._check_rules()
        if vocab_size is None:
            return
        for tok in self.stop_token_ids or []:
            if tok >= vocab_size:
                _fail("stop_token_ids", f"in [0, {vocab_size})", tok)
        for tok in self.logit_bias or {}:
            if tok >= vocab_size:
                _fail("logit_bias", f"keyed by token ids in [0, {vocab_size})", tok)

    def _check_rules(self) -> None:
        """The rules that a field's annotated type cannot state (types and ranges checked)."""
        if not (self.top_k == -1 or self.top_k >= 1):
            _fail("top_k", "-1 (whole vocabulary) or >= 1", self.top_k)
        if self.min_new_tokens > self.max_new_tokens:
            rule = f"<= max_new_tokens ({self.max_new_tokens})"
            _fail("min_new_tokens", rule, self.min_new_tokens)
        if any(s == "" for s in self.stop_strs):
            raise ValueError("stop: stop strings must be non-empty")
        grammars = [g for g in GRAMMAR_FIELDS if getattr(self, g) is not None]
        if len(grammars) > 1:
            raise ValueError(f"{grammars[1]}: only one of {', '.join(grammars)} may be set")
        for bias in (self.logit_bias or {}).values():
            if math.isnan(bias):
                _fail("logit_bias", "a number", bias)


_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(SamplingParams))
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")
_FIELD_PATH = re.compile(r"`\$\.(\w+)`")


def _range_text(meta: msgspec.Meta) -> str:
    """A Meta's bounds as the error text states them: '>= 0', 'in (0, 1]', 'in [-2, 2]'."""
    low = f"[{meta.ge:g}" if meta.ge is not None else None
    low = f"({meta.gt:g}" if meta.gt is not None else low
    high = f"{meta.le:g}]" if meta.le is not None else None
    high = f"{meta.lt:g})" if meta.lt is not None else high
    if low is not None and high is not None:
        return f"in {low}, {high}"
    if low is not None:
        return (">= " if low[0] == "[" else "> ") + low[1:]
    assert high is not None, "a Meta without bounds states no range"
    return ("<= " if high[-1] == "]" else "< ") + high[:-1]


def _field_ranges() -> Mapping[str, str]:
    """Field name → its range text, for the fields whose own annotation carries a Meta."""
    hints = typing.get_type_hints(SamplingParams, include_extras=True)
    out = {}
    for name, hint in hints.items():
        metas = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, msgspec.Meta)]
        if metas:
            out[name] = _range_text(metas[0])
    return MappingProxyType(out)


_FIELD_RANGES = _field_ranges()


def _convert(d: Mapping[str, Any]) -> SamplingParams:
    """msgspec's typed conversion, its errors re-raised as ValueErrors led by the field name."""
    try:
        # str_keys: the object may come from JSON, whose keys are strings (logit_bias).
        return msgspec.convert(d, SamplingParams, str_keys=True)
    except msgspec.ValidationError as exc:
        raise _field_error(exc, d) from None


def _field_error(exc: msgspec.ValidationError, d: Mapping[str, Any]) -> ValueError:
    """'Expected `float` >= 0.0 - at `$.temperature`' → 'temperature: must be >= 0, got -1'.

    A range error of a field states the field's whole range; a type error, or an error inside
    a list or mapping, keeps msgspec's words and says where.
    """
    detail, _, where = str(exc).partition(" - at ")
    top = _FIELD_PATH.fullmatch(where)
    if top is not None and ", got" not in detail and top.group(1) in _FIELD_RANGES:
        field = top.group(1)
        return ValueError(f"{field}: must be {_FIELD_RANGES[field]}, got {d.get(field)!r}")
    field = next(iter(re.findall(r"\$\.(\w+)", where)), "sampling_params")
    detail = detail[:1].lower() + detail[1:]
    if where and top is None:
        detail += f" (at {where})"
    return ValueError(f"{field}: {detail}")


def _fail(field: str, rule: str, value: object) -> None:
    raise ValueError(f"{field}: must be {rule}, got {value!r}")
