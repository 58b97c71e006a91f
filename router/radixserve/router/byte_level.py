"""A byte-level BPE tokenizer's ids for plain ASCII text, from a cache of the ids of each word:
the router's cost of tokenizing a request's new text (a user's question) drops to one regex
split and a dict lookup per word.

Why it is exact. Without a normalizer and without an added token in the text, the tokenizers
library encodes a text in two steps (token_pieces.py has the first one, the added tokens):
1. the pre-tokenizer cuts it into words: each `Split` (a regex whose matches and the text
   between them become words) and then `ByteLevel` (GPT-2's regex when `use_regex`, then each
   byte mapped to a printable character of its own alphabet);
2. the model (BPE) turns each word into ids on its own.
So the text's ids are its words' ids in order, and a word's ids never change: the model is
asked once per word (`model.tokenize`, about 1 µs), not the whole pipeline once per text
(25-40 µs for a 20-word question, most of it bookkeeping of offsets the router does not read).

Step 1 is redone here with Python's `re`, so this is used only where `re` and the Rust side's
Oniguruma surely agree: texts of printable ASCII plus tab, newline and carriage return (where
`\\p{L}` is [A-Za-z], `\\p{N}` is [0-9] and `\\s` is [ \\t\\n\\r] for both), and patterns
made of what both read alike (`\\p{L}` and `\\p{N}` are rewritten, any other `\\p` is refused,
and a pattern that matches the empty text is refused: the two engines step past an empty match
differently). Anything else (a normalizer, `add_prefix_space`, other pre-tokenizers, BPE
dropout) turns it off, and probe texts encoded both ways when it is built catch the rest.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any

from tokenizers import Tokenizer

from radixserve.router.mirror.tree import encode_tokens

logger = logging.getLogger(__name__)

MAX_WORDS = 1 << 16  # words remembered; all forgotten at once past this (no LRU upkeep per hit)
# GPT-2's split, what ByteLevel(use_regex=True) applies (tokenizers' pre_tokenizers/byte_level.rs)
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_OUTSIDE_ASCII = re.compile(r"[^\t\n\r\x20-\x7e]")  # a character the fast path does not take
_CLASSES = {"L": "A-Za-z", "N": "0-9"}
# escapes both engines read alike on that text: classes, control characters, quoted punctuation
_SAME_ESCAPES = frozenset("sSdDwWrnt") | frozenset("\\'\".-[](){}?*+|^$/!#&,:;<=>@_`~% ")
_GROUPS = ("(?:", "(?i:", "(?=", "(?!", "(?<=", "(?<!", "(?>")
PROBES = (
    "Hello world, it's 12345 o'clock!\n\n  Why?\tBecause  we're   here...  ",
    "def f(x):\n    return x ** 2  # ok\r\n\r\nI'LL SEE 'EM, y'all 1.5e-10 0xFF",
    " leading and trailing \n\n\t \n",
    "a  b   c    d\n \n  \n   ",
)


def byte_alphabet() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (the ByteLevel pre-tokenizer's map)."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = [b for b in range(256) if b not in keep]
    out = {b: chr(b) for b in keep}
    out.update({b: chr(256 + i) for i, b in enumerate(shifted)})
    return out


def ascii_pattern(pattern: str) -> re.Pattern[str] | None:
    """An Oniguruma pattern as a Python regex that splits ASCII text alike; None when it uses
    what cannot be translated for sure: an escape outside _SAME_ESCAPES, an anchor, an inline
    flag other than a scoped `(?i:`, a set inside a set, a pattern that matches the empty text
    (the two engines step past an empty match differently)."""
    out: list[str] = []
    i, class_at = 0, -1  # class_at: where the open [...] starts in `out`, -1 outside one
    while i < len(pattern):
        c, rest = pattern[i], pattern[i:]
        m = re.match(r"\\p\{(\w+)\}", rest)
        if m is not None and m.group(1) in _CLASSES:
            cls = _CLASSES[m.group(1)]
            out.append(cls if class_at >= 0 else f"[{cls}]")
            i += len(m.group(0))
            continue
        if c == "\\":
            if rest[1:2] not in _SAME_ESCAPES:
                return None
            out.append(rest[:2])
            i += 2
            continue
        # just after the [ (or [^): a ^ negates it, a ] is read differently by the two
        first = class_at >= 0 and (len(out) == class_at + 1 or out[class_at + 1 :] == ["^"])
        if c == "$" or (c == "^" and not (first and out[-1] == "[")) or (c == "]" and first):
            return None  # Ruby's $ and ^ are line anchors
        if class_at >= 0 and (c == "[" or rest.startswith("&&")):
            return None  # a set inside a set
        if c == "(" and rest.startswith("(?") and not rest.startswith(_GROUPS):
            return None
        if c == "[":
            class_at = len(out)
        elif c == "]" and class_at >= 0:
            class_at = -1
        out.append(c)
        i += 1
    try:
        compiled = re.compile("".join(out), re.ASCII)
    except re.error:
        return None
    return None if compiled.fullmatch("") is not None else compiled


def _splitter(step: dict[str, Any]) -> re.Pattern[str] | None:
    """One pre-tokenizer step that isolates the matches of a pattern, as a Python regex."""
    kind = step.get("type")
    if kind == "ByteLevel":
        if step.get("add_prefix_space") or not step.get("use_regex", True):
            return None
        return ascii_pattern(GPT2_PATTERN)
    if kind != "Split" or step.get("behavior") != "Isolated" or step.get("invert"):
        return None
    pattern = step.get("pattern") or {}
    if "String" in pattern:
        return re.compile(re.escape(pattern["String"])) if pattern["String"] else None
    return ascii_pattern(pattern["Regex"]) if "Regex" in pattern else None


def _splitters(spec: dict[str, Any]) -> list[re.Pattern[str]] | None:
    """The regex splits of the pre-tokenizer, in order; None when it is not one this module
    redoes: ByteLevel alone, or Splits followed by ByteLevel (Llama 3, Qwen 2 and others)."""
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if not steps or steps[-1].get("type") != "ByteLevel" or steps[-1].get("add_prefix_space"):
        return None
    if any(s.get("type") != "Split" for s in steps[:-1]):
        return None
    out = []
    for step in steps:
        if step.get("type") == "ByteLevel" and not step.get("use_regex", True):
            continue  # the map only
        split = _splitter(step)
        if split is None:
            return None
        out.append(split)
    return out or None


def _isolate(pattern: re.Pattern[str], text: str) -> list[str]:
    """The matches of `pattern` in `text` and the text between them, empty ones left out."""
    if not pattern.groups:
        found = pattern.findall(text)  # C-fast; whole when the matches cover the text
        if sum(map(len, found)) == len(text):
            return found
    out, pos = [], 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            out.append(text[pos : m.start()])
        out.append(m.group())
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    return out


class WordEncoder:
    """`encode(text)`: the ids of an ASCII `text` without special tokens (as `encode_tokens`
    bytes), or None when the text is not one it takes (the caller encodes it whole). Build with
    `WordEncoder.of(backend)`."""

    def __init__(self, backend: Tokenizer, splits: list[re.Pattern[str]]) -> None:
        self._tokenize: Callable[[str], Any] = backend.model.tokenize
        self._splits = splits
        self._map = str.maketrans({b: c for b, c in byte_alphabet().items() if b < 128})
        added = [t.content for t in backend.get_added_tokens_decoder().values() if t.content]
        words = sorted((re.escape(t) for t in added if t.isascii()), key=len, reverse=True)
        self._added = re.compile("|".join(words)) if words else None
        self._words: dict[str, bytes] = {}  # bytes: not traversed by the garbage collector

    @classmethod
    def of(cls, backend: Tokenizer) -> WordEncoder | None:
        """For a byte-level BPE tokenizer this module redoes exactly, else None."""
        spec = json.loads(backend.to_str())
        model = spec.get("model") or {}
        if spec.get("normalizer") is not None or model.get("type") != "BPE":
            return None
        if model.get("dropout") not in (None, 0, 0.0):
            return None  # random merges: a word's ids vary between calls
        splits = _splitters(spec)
        if splits is None:
            return None
        enc = cls(backend, splits)
        whole = [e.ids for e in backend.encode_batch(list(PROBES), add_special_tokens=False)]
        if [enc.encode(p) for p in PROBES] != [encode_tokens(ids) for ids in whole]:
            logger.info("tokenizer: words encode differently alone; texts are encoded whole")
            return None
        return enc

    def encode(self, text: str) -> bytes | None:
        if not text.isascii() or _OUTSIDE_ASCII.search(text):
            return None
        if self._added is not None and self._added.search(text):
            return None  # an added token: the tokenizer cuts it out first
        words = _isolate(self._splits[0], text)
        for split in self._splits[1:]:
            words = [w for part in words for w in _isolate(split, part)]
        known = self._words
        if len(known) > MAX_WORDS:
            known.clear()
        out = []
        for word in words:
            ids = known.get(word)
            if ids is None:
                ids = encode_tokens([t.id for t in self._tokenize(word.translate(self._map))])
                known[word] = ids
            out.append(ids)
        return b"".join(out)
