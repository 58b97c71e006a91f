"""The fused element-wise CPU ops of `fused_ops.cpp` with tensor arguments.

`load_fused_ops()` builds (once, cached) and loads the library, or returns None where no
compiler is or the build fails; callers then keep their PyTorch path, which is also the
oracle the tests compare these ops against (`tests/kernels/test_cpu_fused_ops.py`). Each op
checks that it can take its tensors (`supports`) and returns None when it cannot, so a caller
writes `fused(...) or torch_path(...)`-style fallbacks without knowing the layout rules.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

import torch

from radixserve.kernels.cpu.build import KERNEL_DIR, bind, check_rc, load_library
from radixserve.kernels.cpu.dtype_codes import DTYPE_CODES

SOURCE = KERNEL_DIR / "fused_ops.cpp"
_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES: dict[str, list[Any]] = {
    "radixserve_rmsnorm": [ctypes.c_int, *[_P] * 5, *[_I] * 4, ctypes.c_float, ctypes.c_int],
    "radixserve_silu_and_mul": [ctypes.c_int, _P, _P, *[_I] * 3, ctypes.c_int],
    "radixserve_rotary": [ctypes.c_int, *[_P] * 4, *[_I] * 7, ctypes.c_int],
    "radixserve_greedy": [_P, *[_I] * 3, _P, _P, ctypes.c_int],
}


def _rows_ok(x: torch.Tensor) -> bool:
    """A CPU [rows, n] tensor of a supported dtype with a contiguous last dimension."""
    return x.is_cpu and x.dtype in DTYPE_CODES and x.dim() == 2 and x.stride(1) == 1


@dataclass(frozen=True)
class CpuFusedOps:
    """The library's functions (argtypes/restype set by `load_fused_ops`)."""

    lib: Any

    def rmsnorm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        residual: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(weight · norm(x + residual), x + residual), or (weight · norm(x), x) without a
        residual; x, residual [rows, h]. None where the tensors are not supported."""
        if not (_rows_ok(x) and weight.dtype == x.dtype and weight.is_contiguous()):
            return None
        if residual is not None and not (
            _rows_ok(residual) and residual.dtype == x.dtype and residual.shape == x.shape
        ):
            return None
        rows, h = x.shape
        if residual is None:
            out, summed = torch.empty((rows, h), dtype=x.dtype), x
        else:  # one allocation for both outputs
            out, summed = torch.empty((2, rows, h), dtype=x.dtype).unbind(0)
        rc = self.lib.radixserve_rmsnorm(
            DTYPE_CODES[x.dtype],
            x.data_ptr(),
            residual.data_ptr() if residual is not None else None,
            weight.data_ptr(),
            out.data_ptr(),
            summed.data_ptr() if residual is not None else None,
            rows,
            h,
            x.stride(0),
            residual.stride(0) if residual is not None else 0,
            eps,
            torch.get_num_threads(),
        )
        check_rc(rc, "rmsnorm")
        return out, summed

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """silu(x[:, :d]) · x[:, d:] for x [rows, 2d], or None where x is not supported."""
        if not _rows_ok(x) or x.shape[1] % 2:
            return None
        rows, d = x.shape[0], x.shape[1] // 2
        out = torch.empty((rows, d), dtype=x.dtype)
        rc = self.lib.radixserve_silu_and_mul(
            DTYPE_CODES[x.dtype],
            x.data_ptr(),
            out.data_ptr(),
            rows,
            d,
            x.stride(0),
            torch.get_num_threads(),
        )
        check_rc(rc, "silu_and_mul")
        return out

    def rotary_(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> bool:
        """Rotate q [T, Hq, D] and k [T, Hkv, D] in place by cos/sin [T, 1, D] (rotate-half
        form). Returns False, touching nothing, where the tensors are not supported."""
        if not _rotary_ok(q, k, cos, sin):
            return False
        tokens, hq, d = q.shape
        rc = self.lib.radixserve_rotary(
            DTYPE_CODES[q.dtype],
            q.data_ptr(),
            k.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            tokens,
            hq,
            k.shape[1],
            d,
            q.stride(0),
            k.stride(0),
            cos.stride(0),
            torch.get_num_threads(),
        )
        check_rc(rc, "rotary")
        return True

    def greedy(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(ids [B] int64: each row's first maximum, logprobs [B] float32: its log-softmax)
        of float32 logits [B, V]; None where the tensor is not supported."""
        if not (_rows_ok(logits) and logits.dtype == torch.float32 and logits.shape[1] > 0):
            return None
        rows, vocab = logits.shape
        ids = torch.empty(rows, dtype=torch.int64)
        logprobs = torch.empty(rows, dtype=torch.float32)
        rc = self.lib.radixserve_greedy(
            logits.data_ptr(), rows, vocab, logits.stride(0), ids.data_ptr(),
            logprobs.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        check_rc(rc, "greedy")
        return ids, logprobs


def _rotary_ok(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """q/k: heads contiguous within a token; cos/sin: one contiguous row per token, same dtype."""
    tokens, _, d = q.shape
    heads_ok = all(t.is_cpu and t.stride(2) == 1 and t.stride(1) == d for t in (q, k))
    tables_ok = all(
        t.shape[0] == tokens and t.shape[-1] == d and t.stride(-1) == 1 and t.dtype == q.dtype
        for t in (cos, sin)
    )
    return (
        heads_ok
        and tables_ok
        and q.dtype in DTYPE_CODES
        and k.dtype == q.dtype
        and k.shape[0] == tokens
        and k.shape[2] == d
        and d % 2 == 0
        and cos.stride(0) == sin.stride(0)
    )


@functools.cache
def load_fused_ops() -> CpuFusedOps | None:
    """The ops, built or taken from the cache once per process; None where they can't be."""
    lib = load_library(SOURCE, "CPU fused ops")
    if lib is None:
        return None
    bind(lib, _SIGNATURES)
    return CpuFusedOps(lib)
