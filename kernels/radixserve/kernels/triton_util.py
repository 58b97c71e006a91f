# mypy: disable-error-code="no-untyped-def, untyped-decorator"
# (Triton kernels are untyped by nature: @triton.jit is untyped and tl.constexpr is their only
# annotation; the launchers below them are fully typed.)
"""Small Triton helpers shared by the kernels of this package (dot-product dtype policy, sizes).

Owns no state. Imported by the kernel modules only; runs wherever they run.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def is_interpreted(t: torch.Tensor) -> bool:
    """True when kernels on this tensor run under TRITON_INTERPRET (CPU tensors) rather than JIT.

    The interpreter computes through numpy, which has no bf16 and no bf16 matmul: kernels then
    upcast every tl.dot operand to fp32 (the `UPCAST` constexpr), while a GPU keeps the tensor
    core dtype. Decided per call from the tensor's device, never from global state.
    """
    return t.device.type == "cpu"


def require_unit_stride(**tensors: torch.Tensor | None) -> None:
    """Raise ValueError unless each given tensor's last dim is contiguous (the kernels index it
    with plain offsets; every other dim goes through its stride)."""
    for name, t in tensors.items():
        if t is not None and t.numel() and t.stride(-1) != 1:
            raise ValueError(f"{name}: the last dim must be contiguous (stride {t.stride(-1)})")


def next_pow2(n: int, floor: int = 16) -> int:
    """The smallest power of two >= max(n, floor): Triton block sizes (tl.dot needs >= 16)."""
    return max(int(triton.next_power_of_2(max(n, 1))), floor)


@triton.jit
def dot(a, b, UPCAST: tl.constexpr):
    """a [M, K] @ b [K, N] with an fp32 accumulator; operands in b's dtype (fp32 if UPCAST)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a.to(b.dtype), b)


@triton.jit
def load_rows(Base, rows, stride_row, offs, row_mask, col_mask):
    """Base[rows[i] * stride_row + offs[j]] as a [len(rows), len(offs)] tile, 0 where masked."""
    return tl.load(
        Base + rows[:, None] * stride_row + offs[None, :],
        mask=row_mask[:, None] & col_mask[None, :],
        other=0.0,
    )


@triton.jit
def tanh(x):
    """tanh through exp (tl has no tanh in every version and the interpreter)."""
    return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0


def interpreted() -> bool:
    """True when this package's kernels were decorated under TRITON_INTERPRET=1 (they then run
    on CPU tensors through numpy); fixed at import, as Triton reads the variable then."""
    return type(tanh).__name__ == "InterpretedFunction"


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """fp32 x rounded to DTYPE, to nearest even (as torch rounds), returned as fp32.

    The bf16 case rounds by integer arithmetic: the interpreter's own fp32 -> bf16 cast
    truncates, and a value already on the bf16 grid casts exactly everywhere. NaN passes.
    """
    if tl.bfloat16 == DTYPE:
        u = x.to(tl.uint32, bitcast=True)
        r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
        y = tl.where(x != x, x, r)
    elif tl.float32 == DTYPE:
        y = x
    else:
        y = x.to(DTYPE).to(tl.float32)
    return y


@triton.jit
def cast(x, DTYPE: tl.constexpr):
    """fp32 x stored as DTYPE with round-to-nearest-even on every backend (see `round_to`)."""
    return round_to(x, DTYPE).to(DTYPE)
