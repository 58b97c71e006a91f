"""Turns user-facing generate() arguments into validated Req objects and back into SGLang's
output dicts. Shared by the offline Engine and the HTTP server's tokenizer manager."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any

from radixserve.engine.managers.finish_reason import FinishMatchedStr, FinishMatchedToken
from radixserve.engine.managers.req import Req, StopCriteria
from radixserve.engine.sampling import SamplingParams, make_generator


@dataclass(frozen=True, slots=True)
class PromptBatch:
    texts: list[str | None]
    input_ids: list[list[int]]
    params: list[dict[str, Any]]
    is_single: bool


def normalize_inputs(
    tokenizer: Any,
    prompt: str | list[str] | None,
    input_ids: list[int] | list[list[int]] | None,
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None,
) -> PromptBatch:
    """Accept exactly one of prompt / input_ids, single or batched, with per-prompt params."""
    if (prompt is None) == (input_ids is None):
        raise ValueError("prompt: pass exactly one of prompt= or input_ids=")
    if prompt is not None:
        single = isinstance(prompt, str)
        texts: list[str | None] = [prompt] if single else list(prompt)  # type: ignore[list-item]
        if not all(isinstance(t, str) for t in texts):
            raise ValueError("prompt: expected a string or a list of strings")
        ids = [tokenizer.encode(t) for t in texts]
    else:
        assert input_ids is not None
        single = bool(input_ids) and isinstance(input_ids[0], int)
        ids = [list(input_ids)] if single else [list(x) for x in input_ids]  # type: ignore[arg-type]
        texts = [None] * len(ids)
    if isinstance(sampling_params, list):
        if len(sampling_params) != len(ids):
            raise ValueError(
                f"sampling_params: {len(sampling_params)} entries for {len(ids)} prompts"
            )
        params = list(sampling_params)
    else:
        params = [dict(sampling_params or {}) for _ in ids]
    return PromptBatch(texts, ids, params, single)


def stop_criteria(params: SamplingParams, eos_ids: frozenset[int], tokenizer: Any) -> StopCriteria:
    stop_strs = tuple(params.stop_strs)
    max_tokens = max(
        (len(tokenizer.encode(s, add_special_tokens=False)) for s in stop_strs), default=0
    )
    ids = eos_ids | frozenset(params.stop_token_ids or ())
    return StopCriteria(ids, stop_strs, max_tokens)


def build_reqs(  # noqa: PLR0913 - mirrors generate()'s public keyword arguments
    batch: PromptBatch,
    tokenizer: Any,
    eos_ids: frozenset[int],
    vocab_size: int,
    return_logprob: bool,
    top_logprobs_num: int,
) -> list[list[Req]]:
    """One list of Reqs per prompt (n > 1 gives n Reqs with seeds seed, seed+1, …)."""
    if top_logprobs_num < 0:
        raise ValueError(f"top_logprobs_num: must be ≥ 0, got {top_logprobs_num}")
    groups: list[list[Req]] = []
    for text, ids, raw in zip(batch.texts, batch.input_ids, batch.params, strict=True):
        base = SamplingParams.from_dict(raw)
        base.verify(vocab_size)  # before normalize, which rewrites temperature 0 → top_k 1
        base.normalize()
        reqs = []
        for j in range(base.n):
            seed = None if base.sampling_seed is None else base.sampling_seed + j
            params = replace(base, sampling_seed=seed)
            reqs.append(
                Req(
                    rid=uuid.uuid4().hex,
                    origin_input_ids=list(ids),
                    sampling_params=params,
                    stop=stop_criteria(params, eos_ids, tokenizer),
                    generator=make_generator(seed, "cpu"),
                    origin_input_text=text,
                    return_logprob=return_logprob or top_logprobs_num > 0,
                    top_logprobs_num=top_logprobs_num,
                )
            )
        groups.append(reqs)
    return groups


def output_text(req: Req, tokenizer: Any) -> str:
    """Final text with SGLang's stop trimming (the matched stop token / string removed)."""
    params = req.sampling_params
    ids = req.output_ids
    reason = req.finished_reason
    if isinstance(reason, FinishMatchedToken) and not params.no_stop_trim and ids:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)
    if isinstance(reason, FinishMatchedStr) and not params.no_stop_trim:
        pos = text.find(reason.matched)
        if pos >= 0:
            text = text[:pos]
    return text


def build_output(req: Req, tokenizer: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": req.rid,
        "prompt_tokens": len(req.origin_input_ids),
        "completion_tokens": len(req.output_ids),
        "cached_tokens": req.cached_tokens,
        "finish_reason": req.finished_reason.to_json() if req.finished_reason else None,
        "total_retractions": req.retraction_count,
    }
    if req.return_logprob:
        meta["output_token_logprobs"] = [
            [lp, tid, None]
            for lp, tid in zip(req.output_token_logprobs, req.output_ids, strict=False)
        ]
        if req.top_logprobs_num:
            meta["output_top_logprobs"] = [
                [[lp, tid, None] for lp, tid in row] for row in req.output_top_logprobs
            ]
    return {
        "text": output_text(req, tokenizer),
        "output_ids": list(req.output_ids),
        "meta_info": meta,
    }
