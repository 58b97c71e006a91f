"""Finish reasons are one tagged union on the wire: every variant crosses the scheduler →
detokenizer → tokenizer messages as itself, and renders as SGLang's native JSON."""

from __future__ import annotations

import msgspec

from radixserve.engine.detokenizer.detokenizer_manager import DetokenizerManager
from radixserve.engine.ipc.finish_reason import (
    FinishAbort,
    FinishLength,
    FinishMatchedStr,
    FinishMatchedToken,
)
from radixserve.engine.ipc.messages import (
    BatchTokenIDOutput,
    DetokenizeParams,
    DetokenizerInput,
    TokenizerInput,
)

REASONS = [FinishMatchedToken(2), FinishMatchedStr("\n\n"), FinishLength(8), FinishAbort("x", 503)]


class CharTokenizer:
    """id i decodes to chr(i): enough for the detokenizer's windowing."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


def test_every_finish_reason_crosses_both_hops_typed() -> None:
    n = len(REASONS) + 1
    out = BatchTokenIDOutput(
        rids=[f"r{i}" for i in range(n)],
        new_output_ids=[[104, 105]] * n,
        finished_reasons=[*REASONS, None],
        prompt_tokens=[3] * n,
        completion_tokens=[2] * n,
        cached_tokens=[0] * n,
        retractions=[0] * n,
        detokenize=[DetokenizeParams()] * n,
        prompt_tail=[[97]] * n,
    )
    wire = msgspec.msgpack.Decoder(DetokenizerInput).decode(msgspec.msgpack.encode(out))
    assert wire.finished_reasons == [*REASONS, None]
    text_out = DetokenizerManager(CharTokenizer()).handle(wire)
    back = msgspec.msgpack.Decoder(TokenizerInput).decode(msgspec.msgpack.encode(text_out))
    assert back.finished_reasons == [*REASONS, None]
    assert [type(r) for r in back.finished_reasons[:-1]] == [type(r) for r in REASONS]
    assert [r.to_json() for r in REASONS] == [
        {"type": "stop", "matched": 2},
        {"type": "stop", "matched": "\n\n"},
        {"type": "length", "length": 8},
        {"type": "abort", "message": "x", "status_code": 503},
    ]
    assert back.text_deltas[:3] == ["hi", "hi", "hi"]  # a stop id that is not the last is kept
