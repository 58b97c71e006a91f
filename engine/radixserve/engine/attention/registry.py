"""Name → attention backend factory. Hardware branching happens here and nowhere else."""

from __future__ import annotations

from collections.abc import Callable

from radixserve.engine.attention.base import AttentionBackend
from radixserve.engine.attention.grouped_backend import GroupedAttnBackend
from radixserve.engine.attention.paged_cpu import load_paged_kernel
from radixserve.engine.attention.torch_backend import TorchNativeAttnBackend


def _grouped() -> AttentionBackend:
    """The grouped backend with the C++ CPU kernel where it builds (PyTorch path otherwise)."""
    return GroupedAttnBackend(load_paged_kernel())


_BACKENDS: dict[str, Callable[[], AttentionBackend]] = {
    "grouped": _grouped,
    "grouped_pytorch": GroupedAttnBackend,  # the grouped backend without the C++ kernel
    "torch": TorchNativeAttnBackend,
    "torch_native": TorchNativeAttnBackend,
}


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def create_attention_backend(name: str) -> AttentionBackend:
    """`name` as resolved by ServerArgs.resolved_attention_backend (no 'auto' here)."""
    factory = _BACKENDS.get(name)
    if factory is None:
        raise ValueError(f"attention_backend: unknown {name!r}; available: {available_backends()}")
    return factory()
