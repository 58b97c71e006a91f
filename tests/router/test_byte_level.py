"""Word by word gives exactly the ids the tokenizers library gives for the whole text (the
oracle: `Tokenizer.encode` itself), on SmolLM2's tokenizer (GPT-2's ByteLevel split) and on the
same BPE model behind Llama 3's and Qwen 2's split patterns; and what the encoder cannot redo
exactly (other pre-tokenizers, a normalizer, other scripts, added tokens) is left to the
library."""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers

from radixserve.router.byte_level import GPT2_PATTERN, WordEncoder, ascii_pattern
from radixserve.router.mirror.tree import decode_tokens
from radixserve.router.token_pieces import PieceEncoder

LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# ASCII the encoder takes, weighted toward what the splits treat specially
ASCII = string.ascii_letters + string.digits + string.punctuation + " \t\n\r" + "'" * 4 + " " * 8
WORDS = ("'s", "'T", "'re", "'LL", "'d", "  ", "\n\n", " \n ", "\r\n", "123456", "x", "don't")


@pytest.fixture(scope="module")
def smollm(engine_tokenizer: Any) -> Tokenizer:
    """SmolLM2's tokenizer as the router builds it from the engine's /get_tokenizer."""
    return Tokenizer.from_str(engine_tokenizer.backend_tokenizer.to_str())


@pytest.fixture(scope="module")
def smollm_words(smollm: Tokenizer) -> WordEncoder:
    enc = WordEncoder.of(smollm)
    assert enc is not None
    return enc


def _with_split(base: Tokenizer, pattern: str, use_regex: bool = False) -> Tokenizer:
    """`base`'s BPE model behind Split(pattern) + ByteLevel, as Llama 3 and Qwen 2 ship it."""
    tok = Tokenizer.from_str(base.to_str())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex),
        ]
    )
    return tok


def _whole(tok: Tokenizer, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False).ids)


def _ids(enc: WordEncoder, text: str) -> list[int] | None:
    key = enc.encode(text)
    return None if key is None else decode_tokens(key)


texts = st.one_of(
    st.text(alphabet=ASCII, max_size=80),
    st.lists(st.sampled_from(WORDS), max_size=12).map("".join),
    st.lists(st.one_of(st.sampled_from(WORDS), st.text(alphabet=ASCII, max_size=6))).map("".join),
)


@settings(max_examples=600, deadline=None)
@given(texts)
def test_ascii_text_encodes_like_the_library(
    smollm: Tokenizer, smollm_words: WordEncoder, text: str
) -> None:
    enc = smollm_words
    assert _ids(enc, text) == _whole(smollm, text)
    assert _ids(enc, text) == _whole(smollm, text)  # again, from remembered words


SPLITS = [(LLAMA3, False), (QWEN2, False), (LLAMA3, True)]


@pytest.mark.parametrize(("pattern", "use_regex"), SPLITS)
def test_split_patterns_encode_like_the_library(
    smollm: Tokenizer, pattern: str, use_regex: bool
) -> None:
    tok = _with_split(smollm, pattern, use_regex)
    enc = WordEncoder.of(tok)
    assert enc is not None

    @settings(max_examples=300, deadline=None)
    @given(texts)
    def check(text: str) -> None:
        assert _ids(enc, text) == _whole(tok, text)

    check()


def test_other_text_is_left_to_the_library(smollm_words: WordEncoder) -> None:
    for text in ("café", "日本語", "a\x0bb", "a\x1cb", "\x00", "x<|im_end|>y", "<|endoftext|>"):
        assert smollm_words.encode(text) is None, text


def test_an_added_ascii_token_inside_is_left_to_the_library(smollm: Tokenizer) -> None:
    tok = Tokenizer.from_str(smollm.to_str())
    tok.add_tokens([AddedToken("zork", normalized=False, lstrip=True)])
    enc = WordEncoder.of(tok)
    assert enc is not None
    assert enc.encode("a zork b") is None
    assert PieceEncoder(tok).encode("a zork b") == _whole(tok, "a zork b")


def test_pipelines_it_cannot_redo_turn_it_off(smollm: Tokenizer) -> None:
    def variant(**changes: Any) -> Tokenizer:
        tok = Tokenizer.from_str(smollm.to_str())
        for name, value in changes.items():
            setattr(tok, name, value)
        return tok

    assert WordEncoder.of(variant(normalizer=normalizers.NFKC())) is None
    assert WordEncoder.of(variant(pre_tokenizer=pre_tokenizers.Whitespace())) is None
    prefix = pre_tokenizers.ByteLevel(add_prefix_space=True)
    assert WordEncoder.of(variant(pre_tokenizer=prefix)) is None
    assert WordEncoder.of(_with_split(smollm, r"\p{Lu}+")) is None  # no sure translation
    spec = json.loads(smollm.to_str())
    spec["model"]["dropout"] = 0.5
    assert WordEncoder.of(Tokenizer.from_str(json.dumps(spec))) is None


def test_patterns_are_translated_only_when_sure() -> None:
    gpt2 = ascii_pattern(GPT2_PATTERN)
    assert gpt2 is not None
    assert gpt2.pattern == (
        r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+"
    )
    assert ascii_pattern(LLAMA3) is not None
    # Ruby's line anchors, other properties, global flags, sets in sets, empty matches, \h
    for refused in (r"^a", r"a$", r"\p{Lu}", r"(?i)a", r"[[:alpha:]]", r"[a-z&&b]", r"x*", r"\h"):
        assert ascii_pattern(refused) is None, refused


def test_the_piece_encoder_uses_it_for_new_text(smollm: Tokenizer) -> None:
    pieces = PieceEncoder(smollm)
    assert pieces.words is not None
    text = "<|im_start|>user\nWhat's 2 + 2? I'd say 4.<|im_end|>\n<|im_start|>assistant\n"
    assert pieces.encode(text) == _whole(smollm, text)
    assert pieces.words._words  # the question went word by word
