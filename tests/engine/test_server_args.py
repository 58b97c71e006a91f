"""Tests for ServerArgs: validation names the field, unknown kwargs are rejected, chunk_size,
KV events need a port; and for its command-line flags (cli_args)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

import pytest

import radixserve.engine.configs.server_args as server_args
from radixserve.engine.configs.cli_args import add_server_args, server_args_from_namespace
from radixserve.engine.configs.cpu_features import cgroup_cpu_limit, usable_cpus
from radixserve.engine.configs.server_args import (
    A2A_BACKENDS,
    DTYPES,
    EVICTION_POLICIES,
    LOAD_BALANCE_METHODS,
    SCHEDULE_POLICIES,
    ServerArgs,
)

INVALID: list[tuple[dict[str, Any], str]] = [
    ({"dtype": "float64"}, "dtype"),
    ({"page_size": 0}, "page_size"),
    ({"page_size": -4}, "page_size"),
    ({"max_total_tokens": 0}, "max_total_tokens"),
    ({"max_total_tokens": -1}, "max_total_tokens"),
    ({"mem_fraction_static": 0.0}, "mem_fraction_static"),
    ({"mem_fraction_static": 1.0}, "mem_fraction_static"),
    ({"mem_fraction_static": -0.5}, "mem_fraction_static"),
    ({"max_running_requests": 0}, "max_running_requests"),
    ({"max_prefill_tokens": 0}, "max_prefill_tokens"),
    ({"schedule_policy": "sjf"}, "schedule_policy"),
    ({"schedule_conservativeness": 0.0}, "schedule_conservativeness"),
    ({"schedule_conservativeness": -1.0}, "schedule_conservativeness"),
    ({"max_queued_requests": 0}, "max_queued_requests"),
    ({"radix_eviction_policy": "mru"}, "radix_eviction_policy"),
    ({"chunked_prefill_size": 0}, "chunked_prefill_size"),
    ({"chunked_prefill_size": -2}, "chunked_prefill_size"),
    ({"chunked_prefill_size": 15, "page_size": 16}, "chunked_prefill_size"),
    ({"grammar_backend": "outlines"}, "grammar_backend"),
    ({"constrained_json_max_whitespace_cnt": 0}, "constrained_json_max_whitespace_cnt"),
    ({"tool_call_parser": "gpt-9"}, "tool_call_parser"),
    ({"reasoning_parser": "think"}, "reasoning_parser"),
    ({"hicache_ratio": 0.0}, "hicache_ratio"),
    ({"hicache_size": -1.0}, "hicache_size"),
    ({"hicache_write_policy": "write_around"}, "hicache_write_policy"),
    ({"hicache_storage_backend": "hf3fs"}, "hicache_storage_backend"),
    ({"hicache_storage_prefetch_policy": "eager"}, "hicache_storage_prefetch_policy"),
    ({"expert_distribution_recorder_mode": "per_token"}, "expert_distribution_recorder_mode"),
    ({"expert_distribution_recorder_buffer_size": 0}, "expert_distribution_recorder_buffer_size"),
    (
        {"enable_hierarchical_cache": True, "disable_radix_cache": True},
        "enable_hierarchical_cache",
    ),
    (
        {"enable_hierarchical_cache": True, "disaggregation_mode": "decode"},
        "enable_hierarchical_cache",
    ),
    (
        {"enable_hierarchical_cache": True, "hicache_storage_backend_extra_config": "{oops"},
        "hicache_storage_backend_extra_config",
    ),
    (
        {"enable_hierarchical_cache": True, "hicache_storage_backend_extra_config": '{"x": 1}'},
        "hicache_storage_backend_extra_config",
    ),
    (
        {
            "enable_hierarchical_cache": True,
            "hicache_storage_backend_extra_config": '{"file_storage_max_size_gb": 0}',
        },
        "hicache_storage_backend_extra_config",
    ),
    (
        {
            "enable_hierarchical_cache": True,
            "hicache_storage_backend_extra_config": '{"prefetch_threshold": -1}',
        },
        "hicache_storage_backend_extra_config",
    ),
]


@pytest.mark.parametrize(("kwargs", "field"), INVALID, ids=[f"{k}" for k, _ in INVALID])
def test_invalid_value_raises_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}: "):
        ServerArgs(**kwargs)


@pytest.mark.parametrize(("kwargs", "field"), INVALID, ids=[f"{k}" for k, _ in INVALID])
def test_from_kwargs_validates_too(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}: "):
        ServerArgs.from_kwargs(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"page_size": 1},
        {"max_total_tokens": 1},
        {"mem_fraction_static": 0.01},
        {"mem_fraction_static": 0.99},
        {"max_running_requests": 1},
        {"max_prefill_tokens": 1},
        {"schedule_conservativeness": 0.01},
        {"max_queued_requests": 1},
        {"chunked_prefill_size": -1},
        {"chunked_prefill_size": None},
        {"chunked_prefill_size": 16, "page_size": 16},
        {"chunked_prefill_size": 1},
    ],
    ids=str,
)
def test_boundary_values_are_accepted(kwargs: dict[str, Any]) -> None:
    args = ServerArgs(**kwargs)
    for name, value in kwargs.items():
        assert getattr(args, name) == value


@pytest.mark.parametrize("policy", SCHEDULE_POLICIES)
def test_every_policy_is_accepted(policy: str) -> None:
    assert ServerArgs(schedule_policy=policy).schedule_policy == policy


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_is_accepted(dtype: str) -> None:
    assert ServerArgs(dtype=dtype).dtype == dtype


@pytest.mark.parametrize("policy", EVICTION_POLICIES)
def test_every_eviction_policy_is_accepted(policy: str) -> None:
    assert ServerArgs(radix_eviction_policy=policy).radix_eviction_policy == policy


def test_defaults_are_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    args = ServerArgs()
    assert args.page_size == 1
    assert args.max_prefill_tokens == 16384
    assert args.schedule_policy == "lpm"
    # CPU default: 128 tokens per usable core of the rank, within [256, 2048]
    cores = usable_cpus(len(os.sched_getaffinity(0)), cgroup_cpu_limit())
    assert args.chunk_size == max(256, min(2048, 128 * cores))
    assert not args.overlap_schedule  # off on CPU
    assert args.resolved_attention_backend == "grouped"


def test_unknown_kwarg_is_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="unknown engine argument.*'pp_size'"):
        ServerArgs.from_kwargs(pp_size=2)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tp_size": 0}, "tp_size"),
        ({"max_request_body_bytes": 0}, "max_request_body_bytes"),
        ({"header_timeout_s": -1.0}, "header_timeout_s"),
        ({"tp_size": 4, "dp_size": 3, "enable_dp_attention": True}, "dp_size"),
        ({"tp_size": 2, "dp_size": 2, "ep_size": 8}, "ep_size"),
        ({"tp_size": 4, "ep_size": 3}, "ep_size"),  # an EP group is ep_size TP ranks
        ({"tp_size": 2, "ep_size": 2, "moe_a2a_backend": "deepep"}, "moe_a2a_backend"),
        ({"dp_size": 2, "load_balance_method": "minimum_tokens"}, "load_balance_method"),
        # PD: TP ranks share one set of rooms; DP ranks would each need their own
        ({"dp_size": 2, "disaggregation_mode": "prefill"}, "disaggregation_mode"),
        ({"tp_size": 2, "dp_size": 2, "disaggregation_mode": "decode"}, "disaggregation_mode"),
        ({"tp_size": 2, "enable_dp_attention": True}, "enable_dp_attention"),  # dp_size 1
        # under DP attention tp_size is the whole world: ep may not exceed it
        ({"tp_size": 2, "dp_size": 2, "ep_size": 4, "enable_dp_attention": True}, "ep_size"),
        # deterministic inference is refused where it would not hold, never silently partial
        *(
            ({"enable_deterministic_inference": True, **extra}, "enable_deterministic_inference")
            for extra in (
                {"attention_backend": "torch"},
                {"device": "cuda"},
                {"dtype": "float32"},
                {"tp_size": 2},
                {"disable_weight_prepack": True},
                {"disable_rowwise_gemm": True},
            )
        ),
    ],
)
def test_bad_values_are_refused_naming_the_flag(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        ServerArgs.from_kwargs(**kwargs)


def test_tensor_parallelism_is_accepted() -> None:
    assert ServerArgs.from_kwargs(tp_size=2, disaggregation_mode="prefill").tp_size == 2
    assert ServerArgs.from_kwargs(tp_size=4, disaggregation_mode="decode").tp_size == 4
    assert ServerArgs.from_kwargs(tp_size=4).tp_size == 4
    args = ServerArgs.from_kwargs(tp_size=4, ep_size=2, moe_a2a_backend="all_to_all")
    assert (args.ep_size, args.moe_a2a_backend) == (2, "all_to_all")
    args = ServerArgs.from_kwargs(tp_size=2, dp_size=2, load_balance_method="shortest_queue")
    assert (args.dp_size, args.load_balance_method) == (2, "shortest_queue")
    assert (args.num_ranks, args.attn_tp_size) == (4, 2)  # two groups of two TP ranks


def test_dp_attention_layout() -> None:
    args = ServerArgs.from_kwargs(tp_size=4, dp_size=2, ep_size=4, enable_dp_attention=True)
    assert (args.num_ranks, args.attn_tp_size) == (4, 2)  # one world of 4, attention in 2 x 2
    assert not args.overlap_schedule  # token counts are agreed before each forward
    on_gpu = ServerArgs.from_kwargs(
        tp_size=2,
        dp_size=2,
        enable_dp_attention=True,
        device="cuda",
        disable_overlap_schedule=False,
    )
    assert not on_gpu.overlap_schedule


def test_all_unknown_kwargs_are_listed() -> None:
    with pytest.raises(ValueError) as info:
        ServerArgs.from_kwargs(page_size=4, zeta=1, alpha=2)
    assert "['alpha', 'zeta']" in str(info.value)


def test_from_kwargs_builds_known_fields() -> None:
    args = ServerArgs.from_kwargs(page_size=4, chunked_prefill_size=64, max_total_tokens=256)
    assert (args.page_size, args.chunked_prefill_size, args.max_total_tokens) == (4, 64, 256)


@pytest.mark.parametrize(
    ("value", "device", "expected"),
    [(-1, "cpu", None), (None, "cuda", None), (8, "cpu", 8), (1, "cpu", 1)],
)
def test_chunk_size_property(value: int | None, device: str, expected: int | None) -> None:
    assert ServerArgs(chunked_prefill_size=value, device=device).chunk_size == expected


@pytest.mark.parametrize(
    ("cores", "tp", "expected"), [(2, 1, 256), (8, 1, 1024), (64, 1, 2048), (8, 4, 256)]
)
def test_cpu_chunk_default_follows_the_cores_of_a_rank(
    monkeypatch: pytest.MonkeyPatch, cores: int, tp: int, expected: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cores)))
    monkeypatch.setattr(server_args, "cgroup_cpu_limit", lambda: None)  # whatever the host's
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    args = ServerArgs(tp_size=tp)
    assert args.cpu_threads_per_rank == cores // tp
    assert args.chunk_size == expected


@pytest.mark.parametrize(
    ("value", "device", "expected"),
    [(None, "cpu", False), (None, "cuda", True), (True, "cuda", False), (False, "cpu", True)],
)
def test_overlap_schedule_default_is_per_device(
    value: bool | None, device: str, expected: bool
) -> None:
    assert ServerArgs(disable_overlap_schedule=value, device=device).overlap_schedule is expected


def test_auto_dtype_on_cpu_follows_the_cpu_flags() -> None:
    from radixserve.engine.configs.cpu_features import cpu_has_bf16

    expected = "bfloat16" if cpu_has_bf16() else "float32"
    assert ServerArgs(dtype="auto", device="cpu").resolved_dtype == expected


@pytest.mark.parametrize(
    ("flags", "expected"),
    [("fpu avx512f avx512_bf16 amx_tile", True), ("fpu amx_bf16", True), ("fpu avx512f", False)],
)
def test_cpu_has_bf16_reads_cpuinfo_flags(tmp_path: Any, flags: str, expected: bool) -> None:
    from radixserve.engine.configs.cpu_features import cpu_has_bf16

    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    assert cpu_has_bf16(str(info)) is expected
    assert cpu_has_bf16(str(tmp_path / "missing")) is False


@pytest.mark.parametrize(
    ("dtype", "device", "expected"),
    [("auto", "cuda", "bfloat16"), ("float16", "cpu", "float16"), ("float32", "cpu", "float32")],
)
def test_resolved_dtype(dtype: str, device: str, expected: str) -> None:
    assert ServerArgs(dtype=dtype, device=device).resolved_dtype == expected


def test_effective_settings_name_the_resolved_values() -> None:
    args = ServerArgs(device="cpu", dtype="float32")
    line = args.effective_settings()
    assert "dtype=float32" in line and "attention_backend=grouped" in line
    assert f"chunked_prefill_size={args.chunk_size}" in line and "overlap_schedule=False" in line


def test_server_args_are_frozen() -> None:
    args = ServerArgs()
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.page_size = 4  # type: ignore[misc]


# ---- KV events: recorded only where something drains them --------------------------------------


def test_kv_events_port_is_the_only_switch() -> None:
    """--kv-events-port turns events on (SGLang has no separate switch); the old
    --enable-kv-events, which the port implied, is gone."""
    from radixserve.cli import build_parser

    args = ServerArgs(kv_events_port=5557)
    assert args.kv_events_port == 5557
    with pytest.raises(TypeError):
        ServerArgs(enable_kv_events=True)  # type: ignore[call-arg]  # the removed field
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--enable-kv-events"])


def test_in_process_engine_core_refuses_kv_events() -> None:
    """EngineCore runs no publisher: events would pile up in RadixCache.events."""
    from radixserve.engine import EngineCore

    with pytest.raises(ValueError, match=r"^kv_events_port: EngineCore publishes no KV"):
        EngineCore(kv_events_port=5557)


# ---- command-line flags (cli_args) -------------------------------------------------------------


def _parse(*argv: str) -> ServerArgs:
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    return server_args_from_namespace(parser.parse_args(list(argv)))


def test_flags_default_to_the_field_defaults() -> None:
    assert _parse() == ServerArgs()


def test_flags_parse_each_field_type() -> None:
    args = _parse(
        "--page-size", "16", "--mem-fraction-static", "0.5", "--max-total-tokens", "4096",
        "--revision", "main", "--enable-mixed-chunk", "--kv-events-port", "5557",
    )  # fmt: skip
    assert (args.page_size, args.mem_fraction_static, args.max_total_tokens) == (16, 0.5, 4096)
    assert (args.revision, args.enable_mixed_chunk, args.kv_events_port) == ("main", True, 5557)


def test_every_field_has_a_flag_of_its_type() -> None:
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    assert set(actions) == {f.name for f in dataclasses.fields(ServerArgs)}
    assert actions["page_size"].type is int
    assert actions["mem_fraction_static"].type is float
    assert actions["served_model_name"].type is str
    assert isinstance(actions["disable_radix_cache"], argparse._StoreTrueAction)


@pytest.mark.parametrize(
    ("flag", "field", "names"),
    [
        ("--schedule-policy", "schedule_policy", SCHEDULE_POLICIES),
        ("--dtype", "dtype", DTYPES),
        ("--radix-eviction-policy", "radix_eviction_policy", EVICTION_POLICIES),
        ("--moe-a2a-backend", "moe_a2a_backend", A2A_BACKENDS),
        ("--load-balance-method", "load_balance_method", LOAD_BALANCE_METHODS),
    ],
)
def test_choice_flags_take_the_validated_names(
    flag: str, field: str, names: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """The flag offers the names ServerArgs accepts, and refuses another naming the flag."""
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    assert next(a for a in parser._actions if a.dest == field).choices == names
    with pytest.raises(SystemExit):
        parser.parse_args([flag, "nope"])
    assert f"argument {flag}: invalid choice: 'nope'" in capsys.readouterr().err
    with pytest.raises(ValueError, match=rf"^{field}: must be one of {', '.join(names)}, got"):
        ServerArgs(**{field: "nope"})
