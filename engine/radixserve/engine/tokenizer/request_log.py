"""`--log-requests`: one INFO line per finished request, written by the tokenizer manager.

The line carries the request id, prompt / completion / cached token counts, TTFT, end-to-end
latency and the finish reason as fields (`extra=`), so `--log-format json` turns them into JSON
keys. User text (prompt, output) is logged only with `--log-requests-text`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("radixserve.requests")


@dataclass(frozen=True, slots=True)
class RequestLogOptions:
    enabled: bool = False
    with_text: bool = False


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """What one request line says."""

    rid: str  # the scheduler's id of this input (one HTTP request may hold n of them)
    request_id: str  # the HTTP request's X-Request-ID (the rid outside HTTP)
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    ttft_s: float | None
    e2e_s: float
    finish_reason: str
    prompt_text: str | None = None
    output_text: str | None = None
    queue_time_s: float | None = None


def show_request_lines() -> None:
    """Request lines are INFO records, shown even under the default `--log-level warning`:
    asking for `--log-requests` is asking to see them."""
    logger.setLevel(logging.INFO)


def log_finished(done: FinishedRequest, options: RequestLogOptions) -> None:
    if not options.enabled:
        return
    fields: dict[str, Any] = {
        "request_id": done.request_id,
        "rid": done.rid,
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "cached_tokens": done.cached_tokens,
        "ttft_s": None if done.ttft_s is None else round(done.ttft_s, 6),
        "e2e_s": round(done.e2e_s, 6),
        "queue_time_s": None if done.queue_time_s is None else round(done.queue_time_s, 6),
        "finish_reason": done.finish_reason,
    }
    if options.with_text:
        fields["prompt_text"] = done.prompt_text
        fields["output_text"] = done.output_text
    logger.info("request finished", extra=fields)
