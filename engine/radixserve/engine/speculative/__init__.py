"""Speculative decoding: draft tokens (NGRAM: looked up in recent text) and their verification
against the target model's logits in one forward (docs/speculative_decoding.md)."""

from __future__ import annotations

from .ngram_corpus import NgramConfig, NgramCorpus
from .verify import VerifyOutput, verify_drafts

__all__ = ["NgramConfig", "NgramCorpus", "VerifyOutput", "verify_drafts"]
