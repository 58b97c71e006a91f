"""Why a request finished, in SGLang's JSON shape ({"type": "stop"|"length"|"abort", ...})."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class FinishMatchedToken:
    matched: int

    def to_json(self) -> dict[str, Any]:
        return {"type": "stop", "matched": self.matched}


@dataclass(frozen=True, slots=True)
class FinishMatchedStr:
    matched: str

    def to_json(self) -> dict[str, Any]:
        return {"type": "stop", "matched": self.matched}


@dataclass(frozen=True, slots=True)
class FinishLength:
    length: int

    def to_json(self) -> dict[str, Any]:
        return {"type": "length", "length": self.length}


@dataclass(frozen=True, slots=True)
class FinishAbort:
    message: str = "aborted"
    status_code: int = 400

    def to_json(self) -> dict[str, Any]:
        return {"type": "abort", "message": self.message, "status_code": self.status_code}


FinishReason = FinishMatchedToken | FinishMatchedStr | FinishLength | FinishAbort
