"""The finish reasons the scheduler sets on a Req (`FinishLength`, `FinishMatchedToken`, ...).

They are wire types, defined once in `radixserve.engine.ipc.finish_reason` (the messages carry
them); this module names them for the scheduler side.
"""

from __future__ import annotations

from radixserve.engine.ipc.finish_reason import (
    FinishAbort,
    FinishLength,
    FinishMatchedStr,
    FinishMatchedToken,
    FinishReason,
)

__all__ = [
    "FinishAbort",
    "FinishLength",
    "FinishMatchedStr",
    "FinishMatchedToken",
    "FinishReason",
]
