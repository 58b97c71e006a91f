"""HF `architectures` name → model class."""

from __future__ import annotations

from radixserve.engine.models.base import CausalLM
from radixserve.engine.models.deepseek_v2 import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
from radixserve.engine.models.llama import LlamaForCausalLM
from radixserve.engine.models.llama_eagle import LlamaForCausalLMEagle
from radixserve.engine.models.mixtral import MixtralForCausalLM
from radixserve.engine.models.qwen2 import Qwen2ForCausalLM
from radixserve.engine.models.qwen2_moe import Qwen2MoeForCausalLM
from radixserve.engine.models.qwen3 import Qwen3ForCausalLM
from radixserve.engine.models.qwen3_moe import Qwen3MoeForCausalLM

_MODELS: dict[str, type[CausalLM]] = {
    "DeepseekV2ForCausalLM": DeepseekV2ForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
    "LlamaForCausalLMEagle": LlamaForCausalLMEagle,  # an EAGLE draft head (speculative)
    "MixtralForCausalLM": MixtralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def get_model_class(architecture: str) -> type[CausalLM]:
    cls = _MODELS.get(architecture)
    if cls is None:
        raise ValueError(
            f"model architecture {architecture!r} is not supported; "
            f"supported: {supported_architectures()}"
        )
    return cls
