"""The dtype argument of the CPU kernels' C functions: each one that takes a dtype reads 0 as
float32 and 1 as bfloat16 (`fused_ops.cpp`, `paged_attention.cpp`), so the Python side maps
torch dtypes to those codes through this one table."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch

DTYPE_CODES: Mapping[torch.dtype, int] = MappingProxyType({torch.float32: 0, torch.bfloat16: 1})
