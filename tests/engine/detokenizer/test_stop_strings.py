"""The detokenizer owns stop strings: fed a request's ids as the scheduler sends them, it ends
the request at the id whose text completes a stop string (FinishMatchedStr), cuts its ids,
logprobs and count there, never streams the start of a stop string, and drops what the
scheduler still sends for it. SmolLM2's real tokenizer; the oracle is its own `decode` of each
prefix of the ids."""

from __future__ import annotations

from typing import Any

import pytest

from radixserve.engine.detokenizer.detokenizer_manager import DetokenizerManager
from radixserve.engine.ipc.finish_reason import (
    FinishLength,
    FinishMatchedStr,
    FinishReason,
)
from radixserve.engine.ipc.messages import BatchStrOutput, BatchTokenIDOutput, DetokenizeParams
from tests.engine.stop_oracle import completing

PROMPT = [504, 3575, 314]  # any ids: left context for the first decode
TEXT = "The answer is 42. The end of the story."


@pytest.fixture(scope="module")
def tokenizer(smollm_source: Any) -> Any:
    from radixserve.engine.model_loader.loader import load_tokenizer

    return load_tokenizer(smollm_source)


def batch(
    rows: dict[str, list[int]],
    counts: dict[str, int],
    params: dict[str, DetokenizeParams],
    finished: dict[str, FinishReason] | None = None,
) -> BatchTokenIDOutput:
    """One scheduler output: each request's new ids and its completion count so far."""
    rids = list(rows)
    return BatchTokenIDOutput(
        rids=rids,
        new_output_ids=[rows[r] for r in rids],
        finished_reasons=[(finished or {}).get(r) for r in rids],
        prompt_tokens=[len(PROMPT)] * len(rids),
        completion_tokens=[counts[r] for r in rids],
        cached_tokens=[0] * len(rids),
        retractions=[0] * len(rids),
        detokenize=[params[r] for r in rids],
        prompt_tail=[PROMPT] * len(rids),
        output_token_logprobs=[[-float(t) for t in rows[r]] for r in rids],
        output_top_logprobs=[[] for _ in rids],
        queue_times=[None] * len(rids),
    )


def rows_of(out: BatchStrOutput | None, rid: str) -> list[int]:
    return [] if out is None else [i for i, r in enumerate(out.rids) if r == rid]


def test_streamed_stop_ends_at_the_completing_id_and_drops_the_rest(tokenizer: Any) -> None:
    ids = tokenizer.encode(TEXT)
    stop = "swer i"  # ends inside the token " is"
    k = completing(tokenizer, ids, stop)
    expected = tokenizer.decode(ids[:k])
    expected = expected[: expected.find(stop)]
    assert 1 < k < len(ids) - 2
    manager = DetokenizerManager(tokenizer)
    params = {"s": DetokenizeParams(stop_strs=["zzz", stop]), "o": DetokenizeParams()}
    texts = {"s": "", "o": ""}
    finish: dict[str, list[Any]] = {"s": [], "o": []}
    for j, tok in enumerate(ids):
        last = {"o": FinishLength(len(ids))} if j == len(ids) - 1 else {}
        out = manager.handle(
            batch({"s": [tok], "o": [tok]}, {"s": j + 1, "o": j + 1}, params, last)
        )
        assert out is not None  # "o" is in every batch
        for rid in texts:
            for i in rows_of(out, rid):
                texts[rid] += out.text_deltas[i]
                assert expected.startswith(texts["s"])  # never a stop string's start
                finish[rid].append(out.finished_reasons[i])
                if out.finished_reasons[i] is not None and rid == "s":
                    assert out.completion_tokens[i] == k == j + 1
                    assert out.new_output_ids[i] == [tok]
    assert texts["s"] == expected
    assert finish["s"] == [None] * (k - 1) + [FinishMatchedStr(stop)]  # later outputs dropped
    assert texts["o"] == tokenizer.decode(ids)
    # The scheduler's own finish for "s" (after the FinishReq) is its last output: dropped too.
    end = batch({"s": []}, {"s": len(ids)}, params, {"s": FinishMatchedStr(stop)})
    assert manager.handle(end) is None
    assert not manager.stopped and not manager.states  # nothing kept for finished requests


def test_a_stop_inside_a_batch_cuts_ids_logprobs_and_count(tokenizer: Any) -> None:
    ids = tokenizer.encode(TEXT)
    stop = "42."
    k = completing(tokenizer, ids, stop)
    params = {"r": DetokenizeParams(stop_strs=[stop])}
    out = DetokenizerManager(tokenizer).handle(batch({"r": ids}, {"r": 100 + len(ids)}, params))
    assert out is not None
    assert out.finished_reasons == [FinishMatchedStr(stop)]
    assert out.new_output_ids == [ids[:k]]
    assert out.output_token_logprobs == [[-float(t) for t in ids[:k]]]
    assert out.completion_tokens == [100 + k]
    assert out.text_deltas == [TEXT[: TEXT.find(stop)]]


def test_no_stop_trim_keeps_the_string(tokenizer: Any) -> None:
    ids = tokenizer.encode(TEXT)
    k = completing(tokenizer, ids, "42.")
    params = {"r": DetokenizeParams(no_stop_trim=True, stop_strs=["42."])}
    out = DetokenizerManager(tokenizer).handle(batch({"r": ids}, {"r": len(ids)}, params))
    assert out is not None and out.text_deltas == [tokenizer.decode(ids[:k])]


def test_the_schedulers_finish_on_the_completing_id_wins(tokenizer: Any) -> None:
    """Length (and stop tokens) are checked before stop strings on the same id, as in SGLang:
    the request ends with length and its text keeps the string."""
    ids = tokenizer.encode(TEXT)
    k = completing(tokenizer, ids, "42.")
    params = {"r": DetokenizeParams(stop_strs=["42."])}
    length = {"r": FinishLength(k)}
    out = DetokenizerManager(tokenizer).handle(batch({"r": ids[:k]}, {"r": k}, params, length))
    assert out is not None and out.finished_reasons == [FinishLength(k)]
    assert out.text_deltas == [tokenizer.decode(ids[:k])]


def test_a_stop_string_in_a_skipped_special_token_still_ends_the_request(
    tokenizer: Any,
) -> None:
    """SGLang seeks stop strings in the text with special tokens shown: "im_start" matches
    inside <|im_start|> although the request's text skips it."""
    ids = tokenizer.encode("Hi there.<|im_end|>\n<|im_start|>user\nMore")
    k = ids.index(tokenizer.convert_tokens_to_ids("<|im_start|>")) + 1
    params = {"r": DetokenizeParams(stop_strs=["im_start"])}
    manager = DetokenizerManager(tokenizer)
    deltas = []
    for j, tok in enumerate(ids[:k]):
        out = manager.handle(batch({"r": [tok]}, {"r": j + 1}, params))
        assert out is not None
        deltas.append(out.text_deltas[0])
    assert out.finished_reasons == [FinishMatchedStr("im_start")]
    assert "".join(deltas) == tokenizer.decode(ids[:k], skip_special_tokens=True)
