"""Prompt log-probabilities in PD mode: only the prefill computes the prompt, so SGLang's
`input_token_logprobs` (and `input_top_logprobs`) of a native `/generate` come from the
prefill's answer and are put into the decode's, as sglang-router does. A JSON answer (one
object, or a list for a batch) gets them per prompt; a stream gets them in every event
(SGLang's native events repeat the cumulative meta_info, as a co-located engine's do).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

PROMPT_FIELDS = ("input_token_logprobs", "input_top_logprobs")


def wants_prompt_logprobs(route: str, body: dict[str, Any]) -> bool:
    """A native /generate that asks for the prompt's log-probabilities."""
    start = body.get("logprob_start_len", -1)
    return (
        route == "/generate"
        and body.get("return_logprob") is True
        and isinstance(start, int)
        and start >= 0
    )


def prompt_fields(answer: Any) -> list[dict[str, Any]]:
    """Per prompt of a prefill's answer (a JSON value), its prompt log-probability fields."""
    items = answer if isinstance(answer, list) else [answer]
    out = []
    for item in items:
        meta = item.get("meta_info") if isinstance(item, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        out.append({k: meta[k] for k in PROMPT_FIELDS if k in meta})
    return out


def merge_json(decode_body: bytes, prefill_body: bytes | None) -> bytes:
    """The decode's JSON answer with the prefill's prompt fields in each prompt's meta_info;
    unchanged where either does not parse."""
    try:
        answer = json.loads(decode_body)
        fields = prompt_fields(json.loads(prefill_body or b"null"))
    except ValueError:
        return decode_body
    items = answer if isinstance(answer, list) else [answer]
    for item, extra in zip(items, fields, strict=False):
        meta = item.get("meta_info") if isinstance(item, dict) else None
        if isinstance(meta, dict):
            meta.update(extra)
    return json.dumps(answer, ensure_ascii=False).encode()


def last_event_fields(stream_body: bytes | None) -> dict[str, Any]:
    """The prompt fields of a prefill's native stream (its last event that has them)."""
    found: dict[str, Any] = {}
    for event in (stream_body or b"").split(b"\n\n"):
        if not event.startswith(b"data: ") or event == b"data: [DONE]":
            continue
        try:
            fields = prompt_fields(json.loads(event[len(b"data: ") :]))[0]
        except ValueError:
            continue
        found = fields or found
    return found


async def merge_stream(
    chunks: AsyncIterator[bytes], fields: dict[str, Any]
) -> AsyncIterator[bytes]:
    """The decode's native stream, re-framed event by event with `fields` in each meta_info
    (events are cut wherever the transport cut them, so they are joined first)."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        *events, pending = pending.split(b"\n\n")
        for event in events:
            yield _merge_event(event, fields) + b"\n\n"
    if pending:
        yield pending


def _merge_event(event: bytes, fields: dict[str, Any]) -> bytes:
    if not fields or not event.startswith(b"data: ") or event == b"data: [DONE]":
        return event
    try:
        payload = json.loads(event[len(b"data: ") :])
    except ValueError:
        return event
    meta = payload.get("meta_info") if isinstance(payload, dict) else None
    if not isinstance(meta, dict):
        return event
    meta.update(fields)
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode()
