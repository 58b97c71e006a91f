"""Shared helpers of the kernel tests: devices, tolerances, poisoned outputs, paged pools."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from radixserve.kernels import triton_util
from radixserve.kernels.layout import PagedKv, build_kv_indices

# What counts is how the kernels were decorated, which happened when triton first saw them.
INTERPRETED = type(triton_util.dot).__name__ == "InterpretedFunction"
if not INTERPRETED and not torch.cuda.is_available():
    raise RuntimeError(
        "radixserve.kernels was imported (compiled for CUDA) before tests/kernels/conftest.py "
        "could set TRITON_INTERPRET=1, and there is no CUDA device: set TRITON_INTERPRET=1 in "
        "the environment (or the root tests/conftest.py)"
    )

# cpu: tiny shapes under the interpreter; cuda: real shapes, compiled (skipped without CUDA).
DEVICES = [
    pytest.param(
        "cpu",
        id="cpu",
        marks=pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1"),
    ),
    pytest.param(
        "cuda",
        id="cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
        ],
    ),
]
DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16"),
]

# (atol, rtol) of a kernel against its fp32-math reference, the output rounded to the dtype.
# bf16 has an 8-bit mantissa: one rounding step of an O(1) result is 2^-7 ~ 0.008, and the
# kernel and reference may round an intermediate (scores, gate_up) one step apart. On a GPU fp32
# tl.dot runs in TF32 (10-bit mantissa), hence the looser fp32 bound there.
TOLERANCES = {
    ("cpu", torch.float32): (1e-5, 1e-5),
    ("cuda", torch.float32): (1e-2, 1e-2),
    ("cpu", torch.float16): (2e-3, 2e-3),
    ("cuda", torch.float16): (2e-3, 2e-3),
    ("cpu", torch.bfloat16): (2e-2, 2e-2),
    ("cuda", torch.bfloat16): (2e-2, 2e-2),
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """Kernel output vs reference, at the tolerance of the dtype on the output's device."""
    atol, rtol = TOLERANCES[(actual.device.type, dtype)]
    assert not torch.isnan(actual).any(), "an output element was never written (still NaN)"
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)


def randn(gen: torch.Generator, *shape: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """Standard normal drawn on the CPU from `gen` (same values on every device)."""
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)


def poisoned(*shape: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """An output buffer full of NaN: any element the kernel fails to write fails the test."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


@dataclass(frozen=True, slots=True)
class PagedPool:
    """A pool whose requests own random, page-aligned slots, read through req_to_token."""

    req_to_token: torch.Tensor  # [num_rows, max_len] int32
    req_pool_indices: torch.Tensor  # [batch] int64: each request's (shuffled) row
    num_slots: int


def make_pool(seq_lens: list[int], page_size: int, gen: torch.Generator, device: str) -> PagedPool:
    """Allocate ceil(len / page_size) random pages per request (page 0 reserved, spares left).

    Slot = page * page_size + offset, so page size 1 scatters every token and page size 16 gives
    page-aligned runs with a partial last page, as the engine's allocators do.
    """
    pages_per_req = [-(-n // page_size) for n in seq_lens]
    num_pages = sum(pages_per_req) + 4
    perm = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    num_rows, max_len = len(seq_lens) + 2, max([*seq_lens, 1])
    req_to_token = torch.zeros(num_rows, max_len, dtype=torch.int32)
    rows = torch.randperm(num_rows, generator=gen)[: len(seq_lens)]
    for row, n, n_pages in zip(rows.tolist(), seq_lens, pages_per_req, strict=True):
        pages, perm = perm[:n_pages], perm[n_pages:]
        slots = [p * page_size + o for p in pages for o in range(page_size)][:n]
        req_to_token[row, :n] = torch.tensor(slots, dtype=torch.int32)
    return PagedPool(req_to_token.to(device), rows.to(device), num_pages * page_size)


def paged_kv(
    pool: PagedPool, lens: list[int], buffers: tuple[torch.Tensor, torch.Tensor]
) -> PagedKv:
    """The PagedKv view of each request's first lens[i] tokens in `pool`."""
    seq_lens = torch.tensor(lens, dtype=torch.int64, device=pool.req_to_token.device)
    indptr, indices = build_kv_indices(pool.req_to_token, pool.req_pool_indices, seq_lens)
    return PagedKv(buffers[0], buffers[1], indptr, indices)
