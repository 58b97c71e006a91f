"""The C++ paged attention kernel for the CPU (`paged_attention_cpu.cpp`): build, cache, call.

The kernel reads every query row's keys and values straight from the KV pool's slots, so a
decode step no longer gathers each request's whole history per layer. It is plain C++ with
OpenMP and no torch headers: g++ builds it in seconds, once per source/flags/compiler/CPU
(the `.so` lands in a cache folder under a content hash, written atomically, with a file lock
so that parallel test processes build it once). It shares torch's OpenMP runtime (torch
ships `libgomp.so.1` and the kernel asks for that soname), so `torch.set_num_threads` rules
both. Without a compiler, or when the build fails, `load_paged_kernel` returns None and the
grouped backend keeps its pure-PyTorch path (which is also the kernel's test oracle, with
the reference backend).
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("paged_attention_cpu.cpp")
# -ffast-math only when compiling (vectorised exp, reassociated dot products): linking with it
# would pull in crtfastmath.o, which turns on flush-to-zero for the whole process.
COMPILE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffast-math", "-fPIC", "-std=c++17")
LINK_FLAGS = ("-shared", "-fopenmp", "-lmvec", "-lm")
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
_ARGTYPES: list[Any] = [
    ctypes.c_int,
    *[ctypes.c_void_p] * 7,
    *[ctypes.c_int64] * 7,
    ctypes.c_float,
    ctypes.c_int,
]


def cache_dir() -> Path:
    """$RADIXSERVE_KERNEL_CACHE, else $XDG_CACHE_HOME/radixserve/kernels (~/.cache)."""
    explicit = os.environ.get("RADIXSERVE_KERNEL_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "radixserve" / "kernels"


def _cpu_flags() -> str:
    """The CPU's feature flags (-march=native code is only valid where they match)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _build_key(compiler: str) -> str:
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(COMPILE_FLAGS + LINK_FLAGS).encode()):
        h.update(part)
    h.update(version.encode())
    h.update(_cpu_flags().encode())
    return h.hexdigest()[:16]


def _compile(compiler: str, target: Path) -> None:
    """Compile and link into a temporary file beside `target`, then rename it into place."""
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        obj, lib = Path(tmp) / "k.o", Path(tmp) / target.name
        for cmd in (
            [compiler, *COMPILE_FLAGS, "-c", str(SOURCE), "-o", str(obj)],
            [compiler, str(obj), "-o", str(lib), *LINK_FLAGS],
        ):
            subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
        os.replace(lib, target)


def build_library() -> Path:
    """The cached shared library, built first if absent. Raises on any build failure."""
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        raise FileNotFoundError("no C++ compiler (g++ or $CXX) on PATH")
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"paged_attention_cpu-{_build_key(compiler)}.so"
    if target.exists():
        return target
    with open(folder / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            logger.info("attention: building the CPU paged attention kernel into %s", target)
            _compile(compiler, target)
    return target


@dataclass(frozen=True)
class PagedAttentionKernel:
    """`radixserve_paged_attention` of the loaded library, with tensor arguments."""

    fn: Any  # the ctypes function (argtypes/restype set by load_paged_kernel)

    def __call__(  # noqa: PLR0913 - one argument per input of the kernel
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
        kv_row: torch.Tensor,
        kv_len: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """q [N, Hq, D] (rows may be strided), k/v_cache [S, Hkv, D], slots [B, L] int64,
        kv_row/kv_len [N] int64: row r attends slots[kv_row[r], :kv_len[r]] → [N, Hq, D]."""
        n, hq, d = q.shape
        out = torch.empty((n, hq, d), dtype=q.dtype)
        rc = self.fn(
            DTYPE_CODES[q.dtype],
            q.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            slots.data_ptr(),
            kv_row.data_ptr(),
            kv_len.data_ptr(),
            out.data_ptr(),
            n,
            hq,
            k_cache.shape[1],
            d,
            q.stride(0),
            k_cache.stride(0),
            slots.stride(0),
            scale,
            torch.get_num_threads(),
        )
        if rc != 0:
            raise RuntimeError(f"paged attention kernel failed ({rc})")
        return out

    @staticmethod
    def supports(q: torch.Tensor, k_cache: torch.Tensor, slots: torch.Tensor) -> bool:
        """CPU tensors of one supported dtype, in the layouts the kernel indexes."""
        return (
            q.device.type == "cpu"
            and q.dtype in DTYPE_CODES
            and k_cache.dtype == q.dtype
            and q.stride(2) == 1
            and q.stride(1) == q.shape[2]
            and k_cache.stride(2) == 1
            and k_cache.stride(1) == k_cache.shape[2]
            and slots.dtype == torch.int64
            and slots.stride(1) == 1
        )


@functools.cache
def load_paged_kernel() -> PagedAttentionKernel | None:
    """The kernel, built or taken from the cache once per process; None where it can't be."""
    try:
        lib = ctypes.CDLL(str(build_library()))
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        logger.warning("attention: CPU kernel unavailable, using the PyTorch path: %s", detail)
        return None
    fn = lib.radixserve_paged_attention
    fn.restype = ctypes.c_int
    fn.argtypes = _ARGTYPES
    logger.info("attention: CPU paged attention kernel loaded from %s", lib._name)
    return PagedAttentionKernel(fn)
