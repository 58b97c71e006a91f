"""NgramCorpus: draft tokens looked up in what requests have already said (SGLang's NGRAM).

Agent, code-editing and retrieval answers repeat long spans of their prompts, and of other
requests' text: the continuation of the last place the context's suffix appeared is a good
guess of what comes next, and costs a dictionary lookup.

The corpus holds the token sequences of recent requests (each running request's prompt and
output so far; finished ones stay until `capacity` tokens push the oldest out) and two indexes
from every n-gram (n in [min_window, max_window]) to the newest place it was followed by a
token: one per sequence and one over all of them. A draft is the continuation of the longest
suffix of the request's context found, in its own text first (what it already said or was
shown is the best evidence of what it says next), else in any request's: the longest match is
the most specific, the newest the most relevant. An n-gram enters an index only once a token
follows it, so a request's own suffix never matches itself.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NgramConfig:
    min_window: int = 1
    max_window: int = 12
    capacity: int = 1_000_000  # tokens kept over all sequences


class NgramCorpus:
    """Recent token sequences and their n-gram index; one per scheduler (its own thread)."""

    def __init__(self, config: NgramConfig) -> None:
        self.config = config
        self._seqs: OrderedDict[str, list[int]] = OrderedDict()  # oldest first
        self._index: dict[tuple[int, ...], tuple[str, int]] = {}  # n-gram → (seq, next pos)
        self._own: dict[str, dict[tuple[int, ...], int]] = {}  # per sequence: n-gram → next pos
        self._tokens = 0

    def __len__(self) -> int:
        return self._tokens

    def sync(self, key: str, ids: list[int]) -> None:
        """Make sequence `key` hold `ids` (a running request's prompt + outputs): tokens past
        what it held are indexed; a sequence that was retracted or rewritten starts over."""
        seq = self._seqs.get(key)
        if seq is None or len(seq) > len(ids) or seq != ids[: len(seq)]:
            self._drop(key)
            seq = []
            self._seqs[key] = seq
        else:
            self._seqs.move_to_end(key)  # in use: the last to be dropped
        start = len(seq)
        seq.extend(ids[start:])
        self._tokens += len(seq) - start
        self._index_from(key, seq, max(start, 1))
        self._evict(keep=key)

    def _index_from(self, key: str, seq: list[int], start: int) -> None:
        """Index the n-grams that end just before each position p ≥ `start` (now followed)."""
        low, high = self.config.min_window, self.config.max_window
        index, own = self._index, self._own.setdefault(key, {})
        for p in range(start, len(seq)):
            for n in range(low, min(high, p) + 1):
                gram = tuple(seq[p - n : p])
                index[gram] = (key, p)
                own[gram] = p

    def propose(self, ids: list[int], num: int, key: str | None = None) -> list[int]:
        """Up to `num` draft tokens to follow `ids` (sequence `key`'s, when it is one), or none
        where no suffix matches."""
        low, high = self.config.min_window, self.config.max_window
        own = self._own.get(key) if key is not None else None
        for n in range(min(high, len(ids)), low - 1, -1):
            gram = tuple(ids[-n:])
            at = own.get(gram) if own is not None else None
            if at is not None and key is not None and at < len(ids):
                return ids[at : at + num]
            hit = self._index.get(gram)
            if hit is None:
                continue
            seq = self._seqs.get(hit[0])
            if seq is None or hit[1] >= len(seq):
                continue  # its sequence was dropped or rewritten since
            return seq[hit[1] : hit[1] + num]
        return []

    def _drop(self, key: str) -> None:
        self._own.pop(key, None)
        seq = self._seqs.pop(key, None)
        if seq is not None:
            self._tokens -= len(seq)

    def _evict(self, keep: str) -> None:
        """Drop the oldest sequences past `capacity`; rebuild the index once stale entries
        (pointing at dropped sequences) could outnumber the live ones."""
        dropped = False
        while self._tokens > self.config.capacity and len(self._seqs) > 1:
            oldest = next(iter(self._seqs))
            if oldest == keep:
                break
            self._drop(oldest)
            dropped = True
        windows = self.config.max_window - self.config.min_window + 1
        if dropped and len(self._index) > 2 * windows * max(self._tokens, 1):
            self._index = {}
            for key, seq in self._seqs.items():
                self._index_from(key, seq, 1)
