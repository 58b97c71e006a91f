"""The router's merge of a prefill's prompt logprobs into a decode's answer (pd_logprobs.py):
events cut anywhere by the transport, batches, and answers it must leave alone."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from radixserve.router.pd_logprobs import (
    last_event_fields,
    merge_json,
    merge_stream,
    wants_prompt_logprobs,
)

PROMPT = {"input_token_logprobs": [[None, 1, None], [-0.5, 2, None]]}


def _event(meta: dict[str, object]) -> bytes:
    return b"data: " + json.dumps({"text": "x", "meta_info": meta}).encode() + b"\n\n"


def test_only_a_native_generate_with_a_start_asks() -> None:
    ask = {"return_logprob": True, "logprob_start_len": 0}
    assert wants_prompt_logprobs("/generate", ask)
    assert not wants_prompt_logprobs("/v1/completions", ask)
    assert not wants_prompt_logprobs("/generate", {**ask, "logprob_start_len": -1})
    assert not wants_prompt_logprobs("/generate", {**ask, "return_logprob": False})


def test_a_batch_answer_gets_each_prompts_fields() -> None:
    prefill = [{"meta_info": PROMPT}, {"meta_info": {"input_token_logprobs": []}}]
    decode = [{"meta_info": {"id": "a"}}, {"meta_info": {"id": "b"}}]
    merged = json.loads(merge_json(json.dumps(decode).encode(), json.dumps(prefill).encode()))
    assert merged[0]["meta_info"] == {"id": "a", **PROMPT}
    assert merged[1]["meta_info"] == {"id": "b", "input_token_logprobs": []}
    assert merge_json(b"not json", b"{}") == b"not json"
    assert merge_json(b'{"meta_info": {}}', None) == b'{"meta_info": {}}'


def test_a_stream_cut_anywhere_gets_the_fields_in_every_event() -> None:
    prefill = _event({}) + _event(PROMPT) + b"data: [DONE]\n\n"
    fields = last_event_fields(prefill)
    assert fields == PROMPT
    decode = _event({"id": "r", "n": 1}) + _event({"id": "r", "n": 2}) + b"data: [DONE]\n\n"

    async def cut(size: int) -> list[bytes]:
        async def chunks() -> AsyncIterator[bytes]:
            for i in range(0, len(decode), size):
                yield decode[i : i + size]

        return [c async for c in merge_stream(chunks(), fields)]

    for size in (1, 7, len(decode)):
        out = b"".join(asyncio.run(cut(size)))
        events = out.split(b"\n\n")
        metas = [json.loads(e[6:])["meta_info"] for e in events if e.startswith(b"data: {")]
        assert metas == [{"id": "r", "n": 1, **PROMPT}, {"id": "r", "n": 2, **PROMPT}]
        assert out.endswith(b"data: [DONE]\n\n")
