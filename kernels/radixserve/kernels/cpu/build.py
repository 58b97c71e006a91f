"""Build, cache and load one C++ source of the CPU kernels as a shared library.

The sources are plain C++ with OpenMP and no torch headers, so g++ builds each in seconds,
once per source/flags/compiler/CPU: the `.so` lands in a cache folder under a content hash,
written atomically, with a file lock so that parallel test processes build it once. A library
shares torch's OpenMP runtime (torch ships `libgomp.so.1` and the library asks for that
soname), so `torch.set_num_threads` rules both. Without a compiler, or when a build fails,
`load_library` returns None (a warning carries the compiler's error) and the caller keeps its
PyTorch path (which is also the kernel's test oracle); `open_library` raises instead. What
the bindings share about the entries' calls is here too: `bind` (argument types, an int
result), `check_rc` (0 or a negative code) and `DTYPE_CODES`.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

KERNEL_DIR = Path(__file__).parent  # the .cpp sources and the headers they share
# The `dtype` argument of the entries that take one (fused_ops.cpp, paged_attention.cpp).
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}

# -ffast-math only when compiling (vectorised exp, reassociated dot products): linking with it
# would pull in crtfastmath.o, which turns on flush-to-zero for the whole process.
COMPILE_FLAGS = ("-O3", "-fopenmp", "-ffast-math", "-fPIC", "-std=c++17")
# The instruction set: this CPU's. Tests also build other targets (e.g. ("-march=x86-64",))
# to check the code paths of CPUs they do not run on.
NATIVE: tuple[str, ...] = ("-march=native",)
LINK_FLAGS = ("-shared", "-fopenmp", "-lmvec", "-lm")


class KernelBuildError(subprocess.SubprocessError):
    """A source that did not compile or link; the message carries the compiler's output."""


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


def _build_key(source: Path, compiler: str, arch: tuple[str, ...]) -> str:
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    h = hashlib.sha256()
    headers = sorted(source.parent.glob("*.h"))  # what a source may include
    for part in (
        source.read_bytes(),
        *(header.read_bytes() for header in headers),
        " ".join(COMPILE_FLAGS + arch + LINK_FLAGS).encode(),
    ):
        h.update(part)
    h.update(version.encode())
    h.update(_cpu_flags().encode())
    return h.hexdigest()[:16]


def _compile(source: Path, compiler: str, target: Path, arch: tuple[str, ...]) -> None:
    """Compile and link into a temporary file beside `target`, then rename it into place.
    The compiler's own temporaries go there too (TMPDIR): under a read-only root filesystem
    the cache folder may be the only writable place."""
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        obj, lib = Path(tmp) / "k.o", Path(tmp) / target.name
        env = {**os.environ, "TMPDIR": tmp}
        for cmd in (
            [compiler, *COMPILE_FLAGS, *arch, "-c", str(source), "-o", str(obj)],
            [compiler, str(obj), "-o", str(lib), *LINK_FLAGS],
        ):
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
            if run.returncode != 0:
                raise KernelBuildError(
                    f"{source.name}: {cmd[0]} exited {run.returncode}:\n{run.stderr.strip()}"
                )
        os.replace(lib, target)


def build_library(source: Path, arch: tuple[str, ...] = NATIVE) -> Path:
    """The cached shared library of `source` for `arch`, built first if absent. Raises on a
    failure."""
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        raise FileNotFoundError("no C++ compiler (g++ or $CXX) on PATH")
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{source.stem}-{_build_key(source, compiler, arch)}.so"
    if target.exists():
        return target
    with open(folder / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            logger.info("kernels: building %s into %s", source.name, target)
            _compile(source, compiler, target, arch)
    return target


def open_library(source: Path, arch: tuple[str, ...] = NATIVE) -> ctypes.CDLL:
    """The loaded library of `source`, built first if absent. Raises where it can't be:
    OSError (no compiler, a library that won't load), KernelBuildError (the compiler's error)
    or another subprocess.SubprocessError (a compiler that won't run or times out)."""
    return ctypes.CDLL(str(build_library(source, arch)))


def load_library(source: Path, what: str) -> ctypes.CDLL | None:
    """The loaded library of `source`, or None (logged once as a warning naming `what`, with
    the compiler's error where the build failed)."""
    try:
        lib = open_library(source)
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("kernels: %s unavailable, using the PyTorch path: %s", what, exc)
        return None
    logger.info("kernels: %s loaded from %s", what, lib._name)
    return lib


def bind(lib: ctypes.CDLL, signatures: dict[str, list[Any]]) -> None:
    """Give each named function its argument types and an int result: every entry of these
    libraries returns 0 or a negative error code (`check_rc`)."""
    for name, argtypes in signatures.items():
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = argtypes


def check_rc(rc: int, name: str) -> None:
    """Raise on an entry's error code (the arguments were checked before the call, so a
    code here is a bug, not bad input)."""
    if rc != 0:
        raise RuntimeError(f"{name} failed ({rc})")
