"""Kernel tests run the Triton kernels under the interpreter on a machine without CUDA.

TRITON_INTERPRET is read when a kernel is decorated, so it is set here, before any test module
imports triton or radixserve.kernels; on a CUDA machine the kernels compile and the CPU cases
skip (set TRITON_INTERPRET=1 yourself to run them there too).
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def gen(request: pytest.FixtureRequest) -> torch.Generator:
    """A CPU generator seeded from the test's id: fresh inputs per test, same on every run."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))
