"""A tensor- or expert-parallel layout the model or the machine cannot run fails at start-up,
before any process starts, with one ValueError naming the flag: attention heads not divisible,
KV heads neither divisible nor dividing, more ranks than CUDA devices (--tp-size); experts not
divisible by --ep-size, --ep-size on a dense model; under DP attention, heads not divisible by
tp / dp and MLPs not divisible by tp. (ep not dividing tp or above tp × dp, an
unknown --moe-a2a-backend, dp / DP attention: ServerArgs, tests/engine/test_server_args.py.)
EPLB's flags too: redundant slots that do not split over the EP ranks, an unreadable or
misshapen --init-expert-location, EPLB without EP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engine.models.tiny import BASE


def _config_only(folder: Path, **overrides: object) -> str:
    """A model folder with just config.json: the start-up check reads nothing else."""
    cfg = {**BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama", **overrides}
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder)


def _moe_config(folder: Path, experts: int) -> str:
    return _config_only(
        folder,
        architectures=["Qwen3MoeForCausalLM"],
        model_type="qwen3_moe",
        num_experts=experts,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
    )


def test_heads_not_divisible_by_tp(tmp_path: Path) -> None:
    from radixserve.engine import Engine

    with pytest.raises(ValueError, match=r"^tp_size: the model's 4 attention heads .* tp_size 3"):
        Engine(model_path=_config_only(tmp_path), tp_size=3)


def test_kv_heads_neither_split_nor_replicated(tmp_path: Path) -> None:
    from radixserve.engine import Engine

    path = _config_only(tmp_path, num_attention_heads=12, num_key_value_heads=6, head_dim=16)
    with pytest.raises(ValueError, match=r"^tp_size: the model's 6 KV heads"):
        Engine(model_path=path, tp_size=4)


def test_more_ranks_than_cuda_devices(tmp_path: Path) -> None:
    import torch

    from radixserve.engine import Engine

    ranks = max(2, torch.cuda.device_count() + 1)
    with pytest.raises(ValueError, match=rf"^tp_size: {ranks} ranks need {ranks} CUDA devices"):
        Engine(model_path=_config_only(tmp_path), tp_size=ranks, device="cuda")


def test_replicated_kv_heads_are_accepted() -> None:
    from radixserve.engine.configs.model_checks import check_tp_layout
    from radixserve.engine.configs.model_config import ModelConfig

    config = ModelConfig.from_hf_dict({**BASE, "architectures": ["LlamaForCausalLM"]})
    check_tp_layout(config, 4)  # 4 heads split, 2 KV heads each on 2 ranks
    with pytest.raises(ValueError, match="^tp_size:"):
        check_tp_layout(config, 8)


def test_experts_not_divisible_by_ep(tmp_path: Path) -> None:
    from radixserve.engine import Engine

    with pytest.raises(ValueError, match=r"^ep_size: the model's 6 experts .* ep_size 4"):
        Engine(model_path=_moe_config(tmp_path, 6), tp_size=4, ep_size=4)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"ep_num_redundant_experts": 1}, r"^ep_num_redundant_experts: the model's 8 experts \+ 1"),
        ({"init_expert_location": "/no/such.pt"}, r"^init_expert_location: cannot read"),
        (
            {"init_expert_location": '{"logical_count": [[1, 2]]}'},
            r"^init_expert_location: logical_count: expected \[passes,\] 2, 8",
        ),
        ({"enable_eplb": True, "tp_size": 1, "ep_size": 1}, r"^ep_size: EPLB .* needs --ep-size"),
        ({"eplb_rebalance_num_iterations": 0}, r"^eplb_rebalance_num_iterations: must be ≥ 1"),
    ],
)
def test_eplb_flags_that_do_not_fit_the_model(
    tmp_path: Path, flags: dict[str, object], message: str
) -> None:
    from radixserve.engine import Engine

    layout = {"tp_size": 2, "ep_size": 2}
    with pytest.raises(ValueError, match=message):
        Engine(model_path=_moe_config(tmp_path, 8), **{**layout, **flags})


def test_ep_on_a_dense_model(tmp_path: Path) -> None:
    from radixserve.engine import Engine

    with pytest.raises(ValueError, match=r"^ep_size: 2 needs a MoE model"):
        Engine(model_path=_config_only(tmp_path), tp_size=2, ep_size=2)


def test_dp_attention_heads_not_divisible_by_attention_tp(tmp_path: Path) -> None:
    from radixserve.engine import Engine

    path = _config_only(tmp_path, num_attention_heads=6, num_key_value_heads=6, head_dim=16)
    with pytest.raises(
        ValueError,
        match=r"^tp_size: the model's 6 attention heads are not divisible by "
        r"tp_size / dp_size = 4 \(DP attention\)",
    ):
        Engine(model_path=path, tp_size=8, dp_size=2, enable_dp_attention=True)


def test_dp_attention_mlp_not_divisible_by_tp(tmp_path: Path) -> None:
    from radixserve.engine import Engine

    path = _config_only(tmp_path, intermediate_size=100)  # 4 heads split fine over tp / dp = 2
    with pytest.raises(
        ValueError, match=r"^tp_size: the model's MLP intermediate size 100 .* tp_size 8"
    ):
        Engine(model_path=path, tp_size=8, dp_size=4, enable_dp_attention=True)
