"""The KV-event block hash: pinned golden values, chaining, page boundaries, byte encoding and
the signed int64 conversion (the router and stock SGLang must compute the same numbers)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from radixserve.protocol.block_hash import block_hashes, digest_to_int64, hash_page, hash_pages
from tests.child_env import child_env

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
GOLDEN = FIXTURES / "block_hash_golden.json"
GENERATOR = FIXTURES / "make_block_hash_golden.py"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _golden() -> dict:
    return json.loads(GOLDEN.read_text())


# ---- golden values ---------------------------------------------------------------------------


def test_golden_page_size_1_first_five_blocks() -> None:
    assert block_hashes(list(range(40)), 1)[:5] == _golden()["page_size_1_first_5"]


def test_golden_page_size_16_two_full_pages() -> None:
    got = block_hashes(list(range(40)), 16)
    assert len(got) == 2  # 40 tokens = 2 full pages + 8 unhashed
    assert got == _golden()["page_size_16"]


def test_golden_file_agrees_with_the_independent_generator() -> None:
    out = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"],
        capture_output=True,
        text=True,
        check=False,
        env=child_env(),
    )
    assert out.returncode == 0, out.stderr


def test_generator_check_mode_fails_on_drift(tmp_path: Path) -> None:
    tampered = tmp_path / "golden.json"
    shutil.copy(GOLDEN, tampered)
    data = json.loads(tampered.read_text())
    data["page_size_16"][1] += 1
    tampered.write_text(json.dumps(data))
    out = subprocess.run(
        [sys.executable, str(GENERATOR), "--check", "--golden", str(tampered)],
        capture_output=True,
        text=True,
        check=False,
        env=child_env(),
    )
    assert out.returncode != 0
    assert "page_size_16" in out.stderr


# ---- definition ------------------------------------------------------------------------------


def test_first_page_is_sha256_of_little_endian_4_byte_tokens() -> None:
    expected = hashlib.sha256(b"\x04\x03\x02\x01" + b"\x05\x00\x00\x00").digest()
    assert hash_page(None, [0x01020304, 5]) == expected


def test_later_page_prefixes_the_previous_digest() -> None:
    first = hash_page(None, [1, 2])
    expected = hashlib.sha256(first + b"\x03\x00\x00\x00" + b"\xff\x00\x00\x00").digest()
    assert hash_page(first, [3, 255]) == expected
    assert hash_pages([1, 2, 3, 255], 2) == [first, expected]


def test_unsigned_token_above_int32_max_is_encoded_as_4_unsigned_bytes() -> None:
    expected = hashlib.sha256(b"\xff\xff\xff\xff").digest()
    assert hash_page(None, [2**32 - 1]) == expected


def test_second_page_hash_depends_on_the_first_page() -> None:
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = block_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4)
    assert a[0] != b[0]
    assert a[1] != b[1]  # same second page, different history
    assert a[1] != block_hashes([5, 6, 7, 8], 4)[0]


def test_chain_seeded_with_parent_digest_continues_the_root_chain() -> None:
    tokens = list(range(100, 112))
    whole = hash_pages(tokens, 4)
    assert hash_pages(tokens[4:], 4, parent_digest=whole[0]) == whole[1:]


def test_partial_trailing_page_is_not_hashed() -> None:
    assert len(block_hashes(list(range(7)), 4)) == 1
    assert len(block_hashes(list(range(8)), 4)) == 2
    assert block_hashes(list(range(3)), 4) == []
    assert block_hashes(list(range(11)), 4) == block_hashes(list(range(8)), 4)


def test_page_size_one_hashes_every_token() -> None:
    assert len(block_hashes([5, 6, 7], 1)) == 3


def test_block_hashes_are_int64_of_the_chained_digests() -> None:
    tokens = list(range(20))
    assert block_hashes(tokens, 4) == [digest_to_int64(d) for d in hash_pages(tokens, 4)]


# ---- int64 conversion ------------------------------------------------------------------------


def test_digest_to_int64_reads_first_8_bytes_big_endian_signed() -> None:
    assert digest_to_int64(bytes(range(1, 33))) == 0x0102030405060708
    assert digest_to_int64(b"\xff" * 8 + b"\x00" * 24) == -1
    assert digest_to_int64(b"\x80" + b"\x00" * 31) == INT64_MIN
    assert digest_to_int64(b"\x7f" + b"\xff" * 7 + b"\x00" * 24) == INT64_MAX


def test_digest_to_int64_ignores_bytes_after_the_eighth() -> None:
    base = bytes(32)
    assert digest_to_int64(base[:8] + b"\x01" + base[9:]) == 0
    assert digest_to_int64(base[:7] + b"\x01" + base[8:]) == 1


@given(st.lists(st.integers(0, 2**32 - 1), max_size=40), st.integers(1, 8))
def test_block_hashes_are_in_signed_int64_range(tokens: list[int], page_size: int) -> None:
    hashes = block_hashes(tokens, page_size)
    assert len(hashes) == len(tokens) // page_size
    assert all(INT64_MIN <= h <= INT64_MAX for h in hashes)
