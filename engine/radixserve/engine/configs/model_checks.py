"""Start-up checks of a model against the flags: its heads, MLPs and experts split over the
ranks asked for, and devices enough for them. Each failure is a ValueError naming the flag, as
ServerArgs' own checks (which use `check_flag` too)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # model_config imports torch: the router's CLI parses engine flags too
    from radixserve.engine.configs.model_config import ModelConfig
    from radixserve.engine.configs.server_args import ServerArgs


def check_flag(ok: bool, name: str, message: str) -> None:
    """ValueError "name: message" unless `ok`: the one form of a refused flag."""
    if not ok:
        raise ValueError(f"{name}: {message}")


def check_tp_layout(config: ModelConfig, tp_size: int, dp_attention: bool = False) -> None:
    """Refuse a TP size the model's heads cannot be split over (ValueError naming tp_size):
    attention heads must divide evenly; KV heads must divide evenly, or divide tp_size (then
    each KV head is replicated on tp_size / num_kv_heads ranks). Under DP attention the heads
    are split over the attention-TP size (`ServerArgs.attn_tp_size`), which is what is passed."""
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    split = (
        f"tp_size / dp_size = {tp_size} (DP attention)" if dp_attention else f"tp_size {tp_size}"
    )
    check_flag(
        heads % tp_size == 0,
        "tp_size",
        f"the model's {heads} attention heads are not divisible by {split}",
    )
    ok = kv % tp_size == 0 if kv >= tp_size else tp_size % kv == 0
    check_flag(
        ok,
        "tp_size",
        f"the model's {kv} KV heads can be neither split nor replicated over {split} "
        "(one must divide the other)",
    )


def check_mlp_layout(config: ModelConfig, tp_size: int) -> None:
    """Under DP attention the MLPs span the whole TP group: their intermediate sizes must split
    evenly over it (ValueError naming tp_size)."""
    sizes = [config.intermediate_size]
    if config.moe is not None:
        sizes.append(config.moe.shared_expert_intermediate_size or 0)
    for size in sizes:
        check_flag(
            size % tp_size == 0,
            "tp_size",
            f"the model's MLP intermediate size {size} is not divisible by tp_size {tp_size}",
        )


def check_ep_layout(config: ModelConfig, ep_size: int, redundant: int = 0) -> None:
    """Refuse an EP size the model's experts (plus `redundant` EPLB slots) cannot be split
    over (ValueError naming the flag)."""
    if ep_size == 1:
        return
    check_flag(config.moe is not None, "ep_size", f"{ep_size} needs a MoE model; this one is dense")
    experts = config.moe.num_experts if config.moe is not None else 0
    check_flag(
        (experts + redundant) % ep_size == 0,
        "ep_num_redundant_experts" if redundant else "ep_size",
        f"the model's {experts} experts + {redundant} redundant slots are not divisible by "
        f"ep_size {ep_size}",
    )


def check_devices(args: ServerArgs, num_cuda_devices: int) -> None:
    """On CUDA each rank needs its own device (ValueError naming tp_size)."""
    if args.device.startswith("cuda"):
        check_flag(
            args.num_ranks <= num_cuda_devices,
            "tp_size",
            f"{args.num_ranks} ranks need {args.num_ranks} CUDA devices, "
            f"{num_cuda_devices} visible",
        )
