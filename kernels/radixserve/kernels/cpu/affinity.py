"""Pin torch's OpenMP threads to CPUs (`affinity.cpp`, built and cached like the other CPU
kernels). None/False where no compiler is: the OS then places the threads."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

import torch

from radixserve.kernels.cpu.build import KERNEL_DIR, load_library

SOURCE = KERNEL_DIR / "affinity.cpp"


@functools.cache
def _lib() -> Any:
    lib = load_library(SOURCE, "CPU thread binding")
    if lib is not None:
        lib.radixserve_bind_threads.restype = ctypes.c_int
        lib.radixserve_bind_threads.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def bind_omp_threads(cpus: Sequence[int]) -> bool:
    """Set torch's thread count to len(cpus) and pin thread i to cpus[i]; True where every
    thread was pinned."""
    lib = _lib()
    if lib is None or not cpus:
        return False
    torch.set_num_threads(len(cpus))
    array = (ctypes.c_int * len(cpus))(*cpus)
    return bool(lib.radixserve_bind_threads(ctypes.addressof(array), len(cpus)) == 0)
