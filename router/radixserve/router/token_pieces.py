"""Encoding a text piece by piece, cut at the special tokens that always cut it, with the pieces
remembered: a tenant's system prompt is tokenized once, not on every request that carries it.

Why the ids are exactly the tokenizer's. The tokenizers library encodes a text in three steps:
it cuts the raw text at the added tokens it finds (leftmost, longest, no overlaps), normalizes,
pre-tokenizes and runs the model on each piece between them on its own, and then lets the
post-processor add its special tokens. Without those (`add_special_tokens=False`, or a
post-processor that adds none) the ids are the pieces' ids and the cut tokens' ids, in order.

A *boundary* is an added token that the first step cuts out wherever its text appears:
- matched on the raw text (`normalized=False`) with no `lstrip`, `rstrip` or `single_word` rule;
- overlapping no added token that could be matched instead: no other added token contains it,
  and no added token's proper suffix (its own included) is a proper prefix of it;
- its first and last characters are neither spaces nor word characters, so the `lstrip`,
  `rstrip` and `single_word` rules of tokens next to it see the same neighbours in the whole
  text as at the edge of a piece.
Each piece between boundaries then encodes alone as it does inside the text (added tokens in
it included). A few probe texts are encoded both ways when the encoder is built, which catches
what the rules above cannot see (a pre-tokenizer that treats a text's first piece differently,
as Metaspace with `prepend_scheme="first"` does); on any difference, or with
`split_special_tokens`, nothing is cut and every text is encoded whole.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence

from tokenizers import Tokenizer

from radixserve.router.byte_level import WordEncoder
from radixserve.router.mirror.tree import TOKEN_BYTES, decode_tokens, encode_tokens

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 1 << 20  # ids remembered across all pieces (4 bytes each)
PROBES = ("a{x}b", "{x} a {x}", " {x}  x{x}\n", "ab{x}{x}cd", "Hello world{x}\nHello world")


def encode_whole(
    backend: Tokenizer, texts: Sequence[str], add_special_tokens: bool
) -> list[list[int]]:
    """The ids of each text as `encode` gives them. encode_batch_fast (tokenizers >= 0.20)
    skips the character offsets: the same ids, ~30% faster."""
    fast = getattr(backend, "encode_batch_fast", None)
    if fast is None:
        return [backend.encode(t, add_special_tokens=add_special_tokens).ids for t in texts]
    return [e.ids for e in fast(list(texts), add_special_tokens=add_special_tokens)]


def _edge_ok(c: str) -> bool:
    return not (c.isspace() or c.isalnum() or c == "_")


def boundary_tokens(backend: Tokenizer) -> list[str]:
    """The added tokens every occurrence of which is a cut (see the module docstring)."""
    if backend.encode_special_tokens:  # split_special_tokens: added tokens are plain text
        return []
    added = [t for t in backend.get_added_tokens_decoder().values() if t.content]
    contents = [t.content for t in added]
    out = []
    for tok in added:
        x = tok.content
        if tok.normalized or tok.lstrip or tok.rstrip or tok.single_word:
            continue
        if not (_edge_ok(x[0]) and _edge_ok(x[-1])):
            continue
        if any(x in y for y in contents if y != x):
            continue
        if any(y.endswith(x[:k]) for y in contents for k in range(1, len(x)) if len(y) > k):
            continue
        out.append(x)
    return out


class PieceEncoder:
    """`encode(text)`: the ids of `text` without the post-processor's special tokens, from
    remembered pieces where it can; `encode_bytes(text)` the same as `encode_tokens` bytes
    (what the router's trees match on: pieces are held and joined as bytes, which the garbage
    collector never walks). Thread-safe (big bodies are tokenized off the loop)."""

    def __init__(self, backend: Tokenizer, max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
        self.backend = backend
        self.max_tokens = max_tokens
        self._pieces: OrderedDict[str, bytes] = OrderedDict()  # least recently used first
        self._held = 0  # ids held in _pieces
        self._lock = threading.Lock()
        self.words = WordEncoder.of(backend)  # new text (a question) word by word, when exact
        ids = {x: backend.token_to_id(x) for x in boundary_tokens(backend)}
        self._ids = {x: encode_tokens([i]) for x, i in ids.items() if i is not None}
        bounds = list(self._ids)
        self._split = re.compile("(" + "|".join(map(re.escape, bounds)) + ")") if bounds else None
        if self._split is not None and not self._agrees(bounds[0]):
            logger.info("tokenizer: pieces encode differently alone; every text encoded whole")
            self._split = None

    @property
    def cuts(self) -> bool:
        """Whether texts are cut into pieces at all (False: each is encoded whole)."""
        return self._split is not None

    def _agrees(self, x: str) -> bool:
        probes = [p.format(x=x) for p in PROBES]
        whole = encode_whole(self.backend, probes, False)
        return all(self.encode(p) == ids for p, ids in zip(probes, whole, strict=True))

    def encode(self, text: str) -> list[int]:
        return decode_tokens(self.encode_bytes(text))

    def encode_bytes(self, text: str) -> bytes:
        if self._split is None:
            return self._encode_new([text])[0]
        parts = self._split.split(text)  # piece, boundary, piece, ..., piece
        pieces = parts[0::2]
        with self._lock:
            found = [self._get(p) for p in pieces]
        missing = [p for p, ids in zip(pieces, found, strict=True) if ids is None and p]
        fresh: dict[str, bytes] = {}
        if missing:
            fresh = dict(zip(missing, self._encode_new(missing), strict=True))
            with self._lock:
                for piece, ids in fresh.items():
                    self._put(piece, ids)
        out: list[bytes] = []
        for i, piece in enumerate(pieces):
            if i:
                out.append(self._ids[parts[2 * i - 1]])
            known = found[i]
            out.append(fresh.get(piece, b"") if known is None else known)
        return b"".join(out)

    def _encode_new(self, texts: list[str]) -> list[bytes]:
        """Each text's ids: word by word where the WordEncoder takes it, else whole."""
        fast = [self.words.encode(t) for t in texts] if self.words else [None] * len(texts)
        rest = [t for t, ids in zip(texts, fast, strict=True) if ids is None]
        if not rest:
            return fast  # type: ignore[return-value]  # no None left
        slow = iter(encode_whole(self.backend, rest, False))
        return [encode_tokens(next(slow)) if ids is None else ids for ids in fast]

    def _get(self, piece: str) -> bytes | None:
        ids = self._pieces.get(piece)
        if ids is not None:
            self._pieces.move_to_end(piece)
        return ids

    def _put(self, piece: str, ids: bytes) -> None:
        n = len(ids) // TOKEN_BYTES
        if piece in self._pieces or n > self.max_tokens:
            return
        self._pieces[piece] = ids
        self._held += n
        while self._held > self.max_tokens:
            _, old = self._pieces.popitem(last=False)
            self._held -= len(old) // TOKEN_BYTES
