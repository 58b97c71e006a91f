"""Drafts from a draft model: STANDALONE (a smaller model with the target's vocabulary) and
EAGLE (a draft head reading the target's hidden states) propose a chain of tokens.

The draft runner shares the target's request rows and slot allocator (SGLang's layout): the
slot that holds a position's KV in the target's pool holds the draft's KV for it in the draft's
own pool. So a verify's slots are allocated once (`prepare_for_verify`), the draft writes its
KV into them, the target then writes its own, and freeing rejected slots frees both.

Per verify step the draft runs `steps` forwards over the requests that draft:
- first an extend over the positions its KV does not cover yet, up to the request's last
  token: the whole prompt the first time (a prefix the target found in its radix cache has no
  draft KV of this request's), then the one or two tokens the last verify accepted past it;
- then a decode per further draft token.
Each draft token is the draft's argmax: a point mass, so the target's acceptance rule (greedy
match, or accept with probability p(d)) keeps the target's distribution exactly.

EAGLE shifts the chain one position left: the head's position i reads token x_{i+1} with the
target's hidden state f_i (the target runner keeps every token's in its `hidden_pool`, by
slot, so a prefix from the radix cache has them too) and predicts x_{i+2}; further drafts read
the head's own output in place of f. Only the positions read with the target's states count
as the head's KV: the next catch-up recomputes the rest.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixserve.engine.forward_batch import ForwardBatch, ForwardMode
from radixserve.engine.model_executor.model_runner import ModelRunner
from radixserve.engine.scheduler.req import Req


class StandaloneDrafter:
    """`eagle_target`: EAGLE, the target runner whose hidden states the head reads."""

    def __init__(self, runner: ModelRunner, eagle_target: ModelRunner | None = None) -> None:
        self.runner = runner
        self.target = eagle_target
        self.shift = 1 if eagle_target is not None else 0
        # EAGLE: the head's last outputs (one row per request of the last forward), and which
        # of those rows the next forward's requests are
        self._features: torch.Tensor | None = None
        self._select: list[int] = []

    def fill(self, reqs: Sequence[Req], drafts: list[list[int]]) -> None:
        """Overwrite each request's placeholder drafts (their slots already allocated, the
        verify's positions written in the request rows) with the draft model's tokens."""
        rows = [i for i, d in enumerate(drafts) if d]
        if not rows:
            return
        drafting = [reqs[i] for i in rows]
        steps = max(len(drafts[i]) for i in rows)
        tokens = self._catch_up(drafting)
        for i, token in zip(rows, tokens, strict=True):
            drafts[i][0] = token
        prev = list(range(len(rows)))
        for step in range(1, steps):
            live = [j for j, i in enumerate(rows) if len(drafts[rows[j]]) > step]
            self._select, prev = [prev.index(j) for j in live], live
            inputs = [drafts[rows[j]][step - 1] for j in live]
            out = self._decode([drafting[j] for j in live], inputs, step)
            for j, token in zip(live, out, strict=True):
                drafts[rows[j]][step] = token
        for r, i in zip(drafting, rows, strict=True):
            # STANDALONE computed KV for the last token and every draft but the final one;
            # EAGLE's counts only up to the last token's (the rest read its own states)
            r.spec_draft_kv_len = r.seqlen - 1 + (0 if self.shift else len(drafts[i]))

    def _catch_up(self, reqs: list[Req]) -> list[int]:
        """One extend per request over [its draft KV, its last token] (EAGLE: the position
        before it, read with the last token): the first draft."""
        prefix = [r.spec_draft_kv_len for r in reqs]
        seq = [r.seqlen - self.shift for r in reqs]
        ids = [t for r, p in zip(reqs, prefix, strict=True) for t in r.full_ids()[p + self.shift :]]
        positions = [p for a, b in zip(prefix, seq, strict=True) for p in range(a, b)]
        return self._forward(ForwardMode.EXTEND, reqs, prefix, seq, ids, positions)

    def _decode(self, reqs: list[Req], inputs: list[int], step: int) -> list[int]:
        """The draft after `step` earlier drafts: its input is the previous draft, at position
        seqlen − 1 + step (EAGLE: one less; its slot is the verify's)."""
        positions = [r.seqlen - 1 - self.shift + step for r in reqs]
        seq = [p + 1 for p in positions]
        return self._forward(ForwardMode.DECODE, reqs, positions, seq, inputs, positions)

    def _forward(  # noqa: PLR0913 - the batch's columns
        self,
        mode: ForwardMode,
        reqs: list[Req],
        prefix: list[int],
        seq: list[int],
        ids: list[int],
        positions: list[int],
    ) -> list[int]:
        runner = self.runner
        device = runner.device
        table = runner.req_to_token_pool.req_to_token
        pool_idx = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64)
        kv_rows = table[pool_idx, : max(seq)].to(torch.int64)
        out_loc = torch.cat(
            [kv_rows[i, a:b] for i, (a, b) in enumerate(zip(prefix, seq, strict=True))]
        )

        def t(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        hidden = None
        if self.target is not None:  # EAGLE: the target's states, then the head's own
            pool = self.target.hidden_pool
            assert pool is not None
            features = self._features
            if mode is ForwardMode.EXTEND or features is None:
                hidden = pool[out_loc.to(device)]
            else:
                hidden = features[torch.tensor(self._select, device=device)]

        fb = ForwardBatch(
            forward_mode=mode,
            batch_size=len(reqs),
            input_ids=t(ids),
            positions=t(positions),
            req_pool_indices=pool_idx.to(device),
            seq_lens=t(seq),
            out_cache_loc=out_loc.to(device),
            extend_prefix_lens_cpu=prefix,
            extend_seq_lens_cpu=[b - a for a, b in zip(prefix, seq, strict=True)],
            seq_lens_cpu=seq,
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool=runner.token_to_kv_pool,
            attn_backend=runner.attn_backend,
            kv_rows=kv_rows.to(device),
            spec_hidden=hidden,
        )
        out = runner.forward(fb)
        logits = out.next_token_logits
        if self.target is not None:  # each request's last row: the next step's feature
            assert out.hidden_states is not None
            ends = torch.tensor(seq, device=device) - torch.tensor(prefix, device=device)
            self._features = out.hidden_states[ends.cumsum(0) - 1]
        # every attention-TP rank drafts rank 0's tokens (the verify's inputs must agree)
        return list(runner.sync_sampled(logits.argmax(dim=-1)).tolist())
