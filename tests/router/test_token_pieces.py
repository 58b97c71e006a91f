"""Encoding piece by piece at the boundary tokens gives exactly the ids the tokenizers library
gives for the whole text (the oracle: `Tokenizer.encode` itself), on SmolLM2's tokenizer and on
tokenizers built here to hit each rule: an added token that strips spaces, overlapping added
tokens, a pre-tokenizer that treats the first piece differently, split_special_tokens."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from radixserve.router.token_pieces import PieceEncoder, boundary_tokens

SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
# pieces of text around the special tokens: spaces, newlines, partial tokens, other scripts
FRAGMENTS = (*SPECIALS, " ", "  ", "\n", "a", "ab", "é", "<|im_", "|>", "<", ">", "x y",
             "12", "你好")  # fmt: skip


@pytest.fixture(scope="module")
def smollm_backend(engine_tokenizer: Any) -> Tokenizer:
    """SmolLM2's tokenizer as the router builds it from the engine's /get_tokenizer."""
    return Tokenizer.from_str(engine_tokenizer.backend_tokenizer.to_str())


def _whole(backend: Tokenizer, text: str) -> list[int]:
    return list(backend.encode(text, add_special_tokens=False).ids)


def test_smollm_cuts_at_its_special_tokens(smollm_backend: Tokenizer) -> None:
    assert set(SPECIALS) <= set(boundary_tokens(smollm_backend))
    assert PieceEncoder(smollm_backend).cuts


@pytest.fixture(scope="module")
def smollm_encoder(smollm_backend: Tokenizer) -> PieceEncoder:
    """One encoder for every example (building one probes the tokenizer: ~70 ms), so later
    examples also meet pieces that earlier ones left remembered, as a router's encoder does."""
    return PieceEncoder(smollm_backend, max_tokens=4096)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=16), st.text(max_size=40))
def test_any_text_encodes_like_the_whole_text(
    smollm_backend: Tokenizer, smollm_encoder: PieceEncoder, fragments: list[str], free: str
) -> None:
    enc = smollm_encoder
    text = "".join(fragments) + free
    assert enc.encode(text) == _whole(smollm_backend, text)
    assert enc.encode(text) == _whole(smollm_backend, text)  # again, from remembered pieces


def test_a_shared_system_prompt_is_remembered(smollm_backend: Tokenizer) -> None:
    enc = PieceEncoder(smollm_backend)
    system = "<|im_start|>system\n" + "You answer in French. " * 50 + "<|im_end|>\n"
    for question in ("Bonjour ?", "Ça va ?"):
        text = f"{system}<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        assert enc.encode(text) == _whole(smollm_backend, text)
    assert any(len(ids) > 4 * 100 for ids in enc._pieces.values())  # held once, for both


def test_memory_is_bounded_by_ids_held(smollm_backend: Tokenizer) -> None:
    enc = PieceEncoder(smollm_backend, max_tokens=50)
    for i in range(40):
        text = f"<|im_start|>user\nquestion number {i} is here<|im_end|>"
        assert enc.encode(text) == _whole(smollm_backend, text)
    assert 0 < enc._held <= 50 and 4 * enc._held == sum(map(len, enc._pieces.values()))


# ---- tokenizers built to hit each rule ----------------------------------------------------------


def _toy(pre_tokenizer: Any, added: list[AddedToken]) -> Tokenizer:
    """A word-level tokenizer over a small vocabulary with `added` tokens."""
    words = ["a", "b", "c", "▁a", "▁b", "▁c", "ab", "<", ">", "|", "x", "y", " ", "▁", "[UNK]"]
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizer
    tok.add_special_tokens(added)
    return tok


def _agree_on(tok: Tokenizer, texts: list[str]) -> PieceEncoder:
    enc = PieceEncoder(tok)
    for text in texts:
        assert enc.encode(text) == _whole(tok, text), text
    return enc


TEXTS = ["a<s>b", "<s> a <s>", "a <s>  b<s>", "<s><s>", "ab<x>b<s>c", "<x> b", "a  <x>c<s>"]


def test_a_plain_special_token_is_a_boundary() -> None:
    tok = _toy(pre_tokenizers.Whitespace(), [AddedToken("<s>", special=True, normalized=False)])
    assert boundary_tokens(tok) == ["<s>"]
    assert _agree_on(tok, TEXTS).cuts


def test_tokens_that_strip_spaces_or_overlap_are_no_boundaries() -> None:
    tok = _toy(
        pre_tokenizers.Whitespace(),
        [
            AddedToken("<s>", special=True, normalized=False),
            AddedToken("<x>", special=True, normalized=False, lstrip=True, rstrip=True),
            AddedToken("<y", special=True, normalized=False),  # "<y" could start a "<y>..."
            AddedToken("q<y>", special=True, normalized=False),  # contains "<y>"
            AddedToken("<y>", special=True, normalized=False),
            AddedToken("a<", special=True, normalized=False),  # its "<" starts "<s>"
        ],
    )
    assert boundary_tokens(tok) == []
    _agree_on(tok, [*TEXTS, "q<y>a", "a<s>", "<y>b"])


def test_a_first_piece_rule_turns_cutting_off() -> None:
    # Metaspace(prepend_scheme="first") marks only the text's first piece with "▁": a piece
    # encoded alone would get the mark too, so the probes catch it and nothing is cut
    first = pre_tokenizers.Metaspace(prepend_scheme="first")
    tok = _toy(first, [AddedToken("<s>", special=True, normalized=False)])
    enc = _agree_on(tok, TEXTS)
    assert not enc.cuts
    plain = AddedToken("<s>", special=True, normalized=False)
    always = _toy(pre_tokenizers.Metaspace(prepend_scheme="always"), [plain])
    assert _agree_on(always, TEXTS).cuts


def test_split_special_tokens_turns_cutting_off() -> None:
    tok = _toy(pre_tokenizers.Whitespace(), [AddedToken("<s>", special=True, normalized=False)])
    tok.encode_special_tokens = True
    assert boundary_tokens(tok) == []
    _agree_on(tok, TEXTS)


def test_the_router_tokenizer_uses_pieces_exactly(smollm_backend: Tokenizer) -> None:
    from radixserve.router.tokenization import RouterTokenizer

    info = {"tokenizer_json": smollm_backend.to_str(), "special_tokens": {}, "chat_template": None}
    tok = RouterTokenizer.from_info(json.loads(json.dumps(info)))
    text = "<|im_start|>user\nhi<|im_end|>\n"
    assert tok.pieces.cuts and tok.adds_nothing
    assert tok.encode_prompt(text) == list(smollm_backend.encode(text).ids)
