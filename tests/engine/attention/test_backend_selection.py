"""Choosing the GPU backends and graphs: the flags, and the errors that name what is missing.

The oracles are argparse (the generated CLI) and the documented messages: triton on a CPU
without the interpreter names TRITON_INTERPRET, flashinfer without the package names it, a
non-positive --cuda-graph-max-bs names the field.
"""

from __future__ import annotations

import argparse
import importlib.util

import pytest
import torch

from radixserve.engine.attention import create_attention_backend
from radixserve.engine.attention.spec import AttentionSpec
from radixserve.engine.configs.cli_args import add_server_args, server_args_from_namespace
from radixserve.engine.configs.server_args import ServerArgs


def test_cuda_graph_flags_parse_into_server_args() -> None:
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    ns = parser.parse_args(["--cuda-graph-max-bs", "24", "--disable-cuda-graph",
                            "--attention-backend", "triton"])  # fmt: skip
    args = server_args_from_namespace(ns)
    assert (args.cuda_graph_max_bs, args.disable_cuda_graph) == (24, True)
    assert args.resolved_attention_backend == "triton"
    with pytest.raises(ValueError, match=r"^cuda_graph_max_bs: must be ≥ 1, got 0"):
        ServerArgs(cuda_graph_max_bs=0)


def test_triton_on_cpu_without_interpreter_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        create_attention_backend("triton")


def test_flashinfer_needs_cuda_and_its_package() -> None:
    spec = AttentionSpec(4, 2, 16, torch.float32, torch.device("cpu"), 8, 64)
    with pytest.raises(ValueError, match="CUDA devices only"):
        create_attention_backend("flashinfer", spec)
    if importlib.util.find_spec("flashinfer") is None:
        from radixserve.engine.attention.flashinfer_backend import import_flashinfer

        with pytest.raises(ImportError, match="flashinfer-python"):
            import_flashinfer()
