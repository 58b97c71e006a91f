"""Why a request finished: one tagged msgspec union, shared by the scheduler (which sets it),
the wire messages (which carry it) and the HTTP edge (which renders it).

`to_json()` is SGLang's native shape (`{"type": "stop" | "length" | "abort", ...}`); the wire
tags are distinct per variant because two variants share SGLang's "stop" type.
"""

from __future__ import annotations

from typing import Any

import msgspec


class FinishMatchedToken(msgspec.Struct, frozen=True, tag="stop_token"):
    """A stop token (EOS or `stop_token_ids`) was generated; it is the last output id."""

    matched: int

    def to_json(self) -> dict[str, Any]:
        return {"type": "stop", "matched": self.matched}


class FinishMatchedStr(msgspec.Struct, frozen=True, tag="stop_str"):
    """A stop string appeared in the output text."""

    matched: str

    def to_json(self) -> dict[str, Any]:
        return {"type": "stop", "matched": self.matched}


class FinishLength(msgspec.Struct, frozen=True, tag="length"):
    """`max_new_tokens` were generated."""

    length: int

    def to_json(self) -> dict[str, Any]:
        return {"type": "length", "length": self.length}


class FinishAbort(msgspec.Struct, frozen=True, tag="abort"):
    """Ended by the engine (aborted by request, queue full, prompt rejected).

    `status_code` is SGLang's field of the abort reason (400: the request, 503: the server);
    only the HTTP edge turns it into a response status.
    """

    message: str = "aborted"
    status_code: int = 400

    def to_json(self) -> dict[str, Any]:
        return {"type": "abort", "message": self.message, "status_code": self.status_code}


FinishReason = FinishMatchedToken | FinishMatchedStr | FinishLength | FinishAbort
