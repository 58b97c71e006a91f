"""The draft length each request gets next (scheduler/speculation.py): it shrinks to what its
drafts earned and grows back while they keep being accepted."""

from __future__ import annotations

import torch

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.sampling.sampling_params import SamplingParams
from radixserve.engine.scheduler.req import Req, StopCriteria
from radixserve.engine.scheduler.speculation import Speculator
from radixserve.engine.speculative import VerifyOutput


def _verify(spec: Speculator, req: Req, accepted: int) -> int:
    """One verify of `req`'s next drafts with `accepted` of them taken; the drafts it had."""
    room = spec.num_drafts if req.spec_draft_len == 0 else req.spec_draft_len
    draft = list(range(room))
    out = VerifyOutput(
        tokens=[list(range(min(accepted, room) + 1))],
        logprobs=[[0.0] * (min(accepted, room) + 1)],
        top_logprobs=None,
        next_token_ids=torch.zeros(1, dtype=torch.int64),
    )
    spec.on_verified([req], [draft], out)
    return room


def test_rejected_drafts_shrink_and_accepted_ones_grow_back() -> None:
    args = ServerArgs(model_path="unused", speculative_algorithm="NGRAM")
    spec = Speculator(args, None)  # type: ignore[arg-type]  # on_verified reads no KV
    req = Req("r", [1, 2, 3], SamplingParams(), StopCriteria(frozenset()))
    assert _verify(spec, req, 0) == 7  # the full --speculative-num-draft-tokens − 1 at first
    assert _verify(spec, req, 0) == 1  # none accepted: one draft next
    assert req.spec_pause == 2  # and that one rejected too: no drafts for 2 steps
    req.spec_pause = 0
    assert _verify(spec, req, 1) == 1
    assert req.spec_pause == 0  # one draft rejected once drafted nothing less: no pause
    assert _verify(spec, req, 2) == 2  # all accepted: twice as many next
    assert _verify(spec, req, 4) == 4
    assert _verify(spec, req, 7) == 7  # capped at the flag
    assert _verify(spec, req, 2) == 7
    assert req.spec_draft_len == 3  # two of seven accepted: three next
    assert spec.stats.proposed_drafts == 7 + 1 + 1 + 2 + 4 + 7 + 7


def test_a_request_whose_drafts_keep_failing_pauses_longer_each_time() -> None:
    args = ServerArgs(model_path="unused", speculative_algorithm="NGRAM")
    spec = Speculator(args, None)  # type: ignore[arg-type]  # _draft reads no KV
    ids = [5, 6, 7, 8] * 4  # a repeating prompt: the corpus always has a continuation
    req = Req("r", ids, SamplingParams(max_new_tokens=1000), StopCriteria(frozenset()))
    req.spec_draft_len = 1
    pauses = []
    for _ in range(6):
        assert spec._draft(req)  # drafts again once the pause is over
        _verify(spec, req, 0)
        pauses.append(req.spec_pause)
        for _ in range(req.spec_pause):
            assert spec._draft(req) == []
        assert req.spec_pause == 0
    assert pauses == [2, 4, 8, 16, 32, 32]
    _verify(spec, req, 1)  # an accepted draft ends the back-off
    assert (req.spec_pause, req.spec_backoff) == (0, 0)
