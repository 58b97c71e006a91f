"""ReasonerGrammar: a grammar that applies after the answer's reasoning (SGLang's
ReasonerGrammarObject). Until the reasoning's end marker (the ids of "</think>") has been
generated, every token is allowed and the inner grammar sees nothing; from the token after the
marker on, the inner grammar constrains and ends the answer. Scheduler thread only.
"""

from __future__ import annotations

import torch

from .base_grammar_backend import BaseGrammarObject

THINK_END = "</think>"


class ReasonerGrammar(BaseGrammarObject):
    def __init__(self, inner: BaseGrammarObject, think_end_ids: list[int]) -> None:
        self.inner = inner
        self.think_end_ids = think_end_ids
        self.recent: list[int] = []  # the last len(think_end_ids) ids while reasoning
        self.thinking = True

    def accept_token(self, token_id: int) -> bool:
        if not self.thinking:
            return self.inner.accept_token(token_id)
        self.recent = (self.recent + [token_id])[-len(self.think_end_ids) :]
        self.thinking = self.recent != self.think_end_ids
        return True

    def fill_vocab_mask(self, mask: torch.Tensor, row: int) -> None:
        if not self.thinking:  # while thinking the row stays open
            self.inner.fill_vocab_mask(mask, row)

    def is_terminated(self) -> bool:
        return not self.thinking and self.inner.is_terminated()

    def copy(self) -> ReasonerGrammar:
        return ReasonerGrammar(self.inner.copy(), self.think_end_ids)
