"""Prompt log-probabilities (SGLang's `logprob_start_len`), the scheduler's side.

A request asking for them from prompt token s needs the hidden state of every position from
max(s, 1) − 1 to the prompt's second-to-last: position p's logits give the log-probability of
prompt token p + 1. `prefix_match_key` keeps the cache from supplying those positions, so they
are computed, possibly over several prefill chunks; `plan` names each chunk's share of them
when the batch is built (`Req.input_logprob_next` moves on then, so an overlapped next chunk
plans the rest), `record` keeps what the forward returned, and `take` hands the whole list to
the output once, when it is complete.
"""

from __future__ import annotations

import torch

from radixserve.engine.forward_batch import InputLogprobRows
from radixserve.engine.ipc.messages import InputLogprobs
from radixserve.engine.sampling import PromptLogprobs
from radixserve.engine.scheduler.req import Req


def plan(
    reqs: list[Req], prefix_lens: list[int], extend_lens: list[int]
) -> InputLogprobRows | None:
    """The rows of an extend batch that compute prompt log-probabilities (None: none do)."""
    rows: list[int] = []
    targets: list[int] = []
    counts: list[int] = []
    top_k, offset = 0, 0
    for req, start, length in zip(reqs, prefix_lens, extend_lens, strict=True):
        lo = max(start, req.input_logprob_next)
        hi = min(start + length, len(req.origin_input_ids) - 1)
        if not req.wants_input_logprobs or lo >= hi:
            counts.append(0)
        else:
            rows += range(offset + lo - start, offset + hi - start)
            targets += req.origin_input_ids[lo + 1 : hi + 1]
            counts.append(hi - lo)
            top_k = max(top_k, req.top_logprobs_num)
            req.input_logprob_next = hi
        offset += length
    if not rows:
        return None
    as_tensor = torch.tensor  # on the CPU: the logits processor moves them to the model
    return InputLogprobRows(
        as_tensor(rows, dtype=torch.int64), as_tensor(targets, dtype=torch.int64), counts, top_k
    )


def record(reqs: list[Req], parts: list[PromptLogprobs] | None) -> None:
    """Append one forward's share of each request's prompt log-probabilities (None: the
    forward computed none)."""
    for req, part in zip(reqs, parts or (), strict=parts is not None):
        req.input_token_logprobs.extend(part.token_logprobs)
        if req.top_logprobs_num:
            top = (row[: req.top_logprobs_num] for row in part.top_logprobs)
            req.input_top_logprobs.extend(top)


def take(req: Req) -> InputLogprobs | None:
    """What the output carries for `req`: all its prompt log-probabilities the first time
    they are complete, else None."""
    if req.input_logprobs_sent or not req.input_logprobs_complete():
        return None
    req.input_logprobs_sent = True
    return InputLogprobs(
        req.origin_input_ids[req.logprob_start_len :],
        req.input_token_logprobs,
        req.input_top_logprobs if req.top_logprobs_num else [],
    )
