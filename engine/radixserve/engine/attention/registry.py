"""Name → attention backend factory, called once by the ModelRunner at load. It picks no
hardware itself: ServerArgs.resolved_attention_backend turns `auto` into a name per device,
model_runner.py makes the other device choices (fused ops, CPU weight prepack, CUDA graphs),
and some kernels check their tensors' device per call (the CPU paged attention,
vocab_parallel)."""

from __future__ import annotations

from collections.abc import Callable

from radixserve.engine.attention.base import AttentionBackend
from radixserve.engine.attention.grouped_backend import GroupedAttnBackend
from radixserve.engine.attention.spec import AttentionSpec
from radixserve.engine.attention.torch_backend import TorchNativeAttnBackend
from radixserve.kernels.cpu.mla_decode import load_mla_decode
from radixserve.kernels.cpu.paged_attention import load_paged_attention


def _grouped(spec: AttentionSpec | None) -> AttentionBackend:
    """The grouped backend with the C++ CPU kernels where they build (PyTorch path otherwise;
    deterministic inference refuses to start without them), its tiled extends unless the spec
    turns them off."""
    deterministic = spec is not None and spec.deterministic
    tiled = spec is None or spec.tiled_extend
    kernel = load_paged_attention()
    if deterministic and kernel is None:
        raise RuntimeError(
            "enable_deterministic_inference: the C++ paged attention kernel could not be "
            "built here (see the warning above); it is the one attention path it relies on"
        )
    # MLA models only: built on first use (a model without MLA never compiles it)
    is_mla = spec is not None and spec.v_head_dim not in (None, spec.head_dim)
    mla = load_mla_decode() if is_mla else None
    if deterministic and is_mla and mla is None:
        raise RuntimeError(
            "enable_deterministic_inference: the C++ MLA decode kernel could not be built "
            "here (see the warning above); MLA attention relies on it"
        )
    return GroupedAttnBackend(kernel, deterministic, tiled_extend=tiled, mla_kernel=mla)


def _triton(spec: AttentionSpec | None) -> AttentionBackend:
    from radixserve.engine.attention.triton_backend import TritonAttnBackend

    return TritonAttnBackend(spec)


def _flashinfer(spec: AttentionSpec | None) -> AttentionBackend:
    from radixserve.engine.attention.flashinfer_backend import FlashInferAttnBackend

    if spec is None:
        raise ValueError("attention_backend=flashinfer needs the model's AttentionSpec")
    return FlashInferAttnBackend(spec)


# Backends that import triton / flashinfer import them when built, never at registry import.
_BACKENDS: dict[str, Callable[[AttentionSpec | None], AttentionBackend]] = {
    "flashinfer": _flashinfer,
    "grouped": _grouped,
    "grouped_pytorch": lambda _spec: GroupedAttnBackend(),  # without the C++ kernel
    "torch": lambda _spec: TorchNativeAttnBackend(),
    "torch_native": lambda _spec: TorchNativeAttnBackend(),
    "triton": _triton,
}


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def create_attention_backend(name: str, spec: AttentionSpec | None = None) -> AttentionBackend:
    """`name` as resolved by ServerArgs.resolved_attention_backend (no 'auto' here); `spec`
    (model shape, batch limits, device) is what planning backends size their buffers by."""
    factory = _BACKENDS.get(name)
    if factory is None:
        raise ValueError(f"attention_backend: unknown {name!r}; available: {available_backends()}")
    return factory(spec)
