"""Per-request sampling parameters: names, defaults, parsing, validation and normalisation.

Owns `SamplingParams`, the one place that knows SGLang's parameter names, their defaults, the
types a request may give for them and the ranges they must fall in. It holds no tensors; turning a
batch of parameters into tensors is `sampling_batch_info`'s job.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

# Below this temperature the distribution is treated as a point mass (SGLang's threshold).
_GREEDY_TEMPERATURE = 1e-6


@dataclass(slots=True)
class SamplingParams:
    """How one request's next tokens are chosen and when its generation stops."""

    max_new_tokens: int = 128
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 means the whole vocabulary
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    sampling_seed: int | None = None  # None: a fresh random generator; an int reproduces exactly
    logit_bias: dict[int, float] | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> SamplingParams:
        """Build from a request's JSON object; reject unknown keys and values of the wrong type.

        Ranges are not checked here (see `verify`), so a caller can report every problem the
        same way whichever step found it.
        """
        if d is None:
            return cls()
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in d.items():
            if key not in known:
                raise ValueError(f"unknown sampling parameter {key!r}")
            kwargs[key] = _COERCERS[key](key, value)
        return cls(**kwargs)

    @property
    def is_greedy(self) -> bool:
        """Whether the argmax is always taken (true before and after `normalize`)."""
        return self.top_k == 1 or self.temperature < _GREEDY_TEMPERATURE

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
        """Raise ValueError, its message starting with the field name, on an out-of-range value."""
        _verify_lengths(self)
        _verify_distribution(self)
        _verify_penalties(self)
        _verify_token_ids(self, vocab_size)
        if any(s == "" for s in self.stop_strs):
            raise ValueError("stop: stop strings must be non-empty")


def _fail(field: str, rule: str, value: object) -> None:
    raise ValueError(f"{field}: must be {rule}, got {value!r}")


# The range checks below are written as `not (ok)` so that NaN, which fails every comparison,
# is rejected rather than slipping through.


def _verify_lengths(p: SamplingParams) -> None:
    if not p.max_new_tokens >= 0:
        _fail("max_new_tokens", ">= 0", p.max_new_tokens)
    if not p.min_new_tokens >= 0:
        _fail("min_new_tokens", ">= 0", p.min_new_tokens)
    if not p.min_new_tokens <= p.max_new_tokens:
        _fail("min_new_tokens", f"<= max_new_tokens ({p.max_new_tokens})", p.min_new_tokens)
    if not p.n >= 1:
        _fail("n", ">= 1", p.n)


def _verify_distribution(p: SamplingParams) -> None:
    if not p.temperature >= 0.0:
        _fail("temperature", ">= 0", p.temperature)
    if not 0.0 < p.top_p <= 1.0:
        _fail("top_p", "in (0, 1]", p.top_p)
    if not (p.top_k == -1 or p.top_k >= 1):
        _fail("top_k", "-1 (whole vocabulary) or >= 1", p.top_k)
    if not 0.0 <= p.min_p <= 1.0:
        _fail("min_p", "in [0, 1]", p.min_p)


def _verify_penalties(p: SamplingParams) -> None:
    if not -2.0 <= p.frequency_penalty <= 2.0:
        _fail("frequency_penalty", "in [-2, 2]", p.frequency_penalty)
    if not -2.0 <= p.presence_penalty <= 2.0:
        _fail("presence_penalty", "in [-2, 2]", p.presence_penalty)
    if not 0.0 < p.repetition_penalty <= 2.0:
        _fail("repetition_penalty", "in (0, 2]", p.repetition_penalty)


def _verify_token_ids(p: SamplingParams, vocab_size: int | None) -> None:
    upper = math.inf if vocab_size is None else vocab_size
    rule = ">= 0" if vocab_size is None else f"in [0, {vocab_size})"
    for tok in p.stop_token_ids or []:
        if not 0 <= tok < upper:
            _fail("stop_token_ids", rule, tok)
    for tok, bias in (p.logit_bias or {}).items():
        if not 0 <= tok < upper:
            _fail("logit_bias", f"keyed by token ids {rule}", tok)
        if math.isnan(bias):
            _fail("logit_bias", "a number", bias)


# --- type coercion for from_dict -------------------------------------------------------------


def _int(field: str, v: object) -> int:
    # bool is a subclass of int; `"temperature": true` is a client bug, not a 1.
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{field}: expected an integer, got {type(v).__name__}")
    return v


def _float(field: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{field}: expected a number, got {type(v).__name__}")
    return float(v)


def _bool(field: str, v: object) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{field}: expected a boolean, got {type(v).__name__}")
    return v


def _opt_int(field: str, v: object) -> int | None:
    return None if v is None else _int(field, v)


def _stop(field: str, v: object) -> str | list[str] | None:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)) and all(isinstance(s, str) for s in v):
        return list(v)
    raise ValueError(f"{field}: expected a string or a list of strings")


def _int_list(field: str, v: object) -> list[int] | None:
    if v is None:
        return None
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"{field}: expected a list of integers, got {type(v).__name__}")
    return [_int(field, x) for x in v]


def _bias_key(field: str, k: object) -> int:
    # JSON object keys are always strings, so OpenAI-style {"50256": -100} must be accepted.
    if isinstance(k, str) and k.lstrip("-").isdigit():
        return int(k)
    return _int(field, k)


def _logit_bias(field: str, v: object) -> dict[int, float] | None:
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise ValueError(f"{field}: expected a mapping of token id to bias")
    return {_bias_key(field, k): _float(field, b) for k, b in v.items()}


_COERCERS: Mapping[str, Callable[[str, Any], Any]] = MappingProxyType(
    {
        "max_new_tokens": _int,
        "stop": _stop,
        "stop_token_ids": _int_list,
        "temperature": _float,
        "top_p": _float,
        "top_k": _int,
        "min_p": _float,
        "frequency_penalty": _float,
        "presence_penalty": _float,
        "repetition_penalty": _float,
        "min_new_tokens": _int,
        "ignore_eos": _bool,
        "skip_special_tokens": _bool,
        "spaces_between_special_tokens": _bool,
        "no_stop_trim": _bool,
        "n": _int,
        "sampling_seed": _opt_int,
        "logit_bias": _logit_bias,
    }
)
