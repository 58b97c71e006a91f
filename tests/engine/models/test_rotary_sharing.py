"""One RotaryEmbedding (one cos/sin table pair) per model, whatever the number of layers."""

from __future__ import annotations

import pytest
from torch import nn

from radixserve.engine.configs.model_config import ModelConfig
from radixserve.engine.models import get_model_class
from tests.engine.models.tiny import BASE


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_one_rotary_table_per_model(arch: str) -> None:
    config = ModelConfig.from_hf_dict({**BASE, "architectures": [arch], "num_hidden_layers": 4})
    model: nn.Module = get_model_class(arch)(config)
    tables = [
        name
        for name, _ in model.named_buffers(remove_duplicate=False)
        if name.endswith(("cos_cached", "sin_cached"))
    ]
    assert sorted(tables) == ["model.rotary_emb.cos_cached", "model.rotary_emb.sin_cached"]
