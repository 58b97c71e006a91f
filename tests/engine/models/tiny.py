"""Tiny random-weight HF checkpoints (Llama / Qwen2 / Qwen3, the MoE Qwen3-MoE / Mixtral /
Qwen2-MoE, and DeepSeek-V2 / V3 with MLA) and logits from both sides.

`save_tiny` builds a model with transformers, perturbs every parameter (HF initialises norms
to one and biases to zero, which would hide bugs in those paths), and writes it with a
word-level tokenizer so `Engine(model_path=folder)` loads it like any HF checkpoint.
`EngineBatch` drives prefill and decode forwards the way the Scheduler does, but returns
the raw next-token logits instead of sampling.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

VOCAB = 256
MAX_POS = 256

BASE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": VOCAB,
    "max_position_embeddings": MAX_POS,
    "rms_norm_eps": 1e-6,
}


# 8 experts, top-2 (MOE_KINDS add their own switches on top)
MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 32}
MOE_KINDS: dict[str, dict[str, Any]] = {
    # layer 1 dense (mlp_only_layers): sparse and dense MLPs in one model; renormalised top-k
    "qwen3_moe": {**MOE, "num_experts": 8, "norm_topk_prob": True, "mlp_only_layers": [1]},
    "mixtral": {"num_experts_per_tok": 2, "num_local_experts": 8, "intermediate_size": 32},
    # shared expert + sigmoid gate on both layers; top-k weights not renormalised
    "qwen2_moe": {
        **MOE,
        "num_experts": 8,
        "norm_topk_prob": False,
        "shared_expert_intermediate_size": 48,
    },
}


# DeepSeek (MLA + grouped top-k MoE): 3 layers, the first dense (first_k_dense_replace); 8
# routed experts in 4 groups of which the best 2 are candidates, top-2; widths all distinct
# (nope 32, rope 16, v 24, latent 32) so a mixed-up split fails. YaRN with mscale ≠ 1.
_DEEPSEEK = {
    "num_hidden_layers": 3,
    "num_key_value_heads": 4,
    "first_k_dense_replace": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "n_group": 4,
    "topk_group": 2,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 24,
}
DEEPSEEK_KINDS: dict[str, dict[str, Any]] = {
    # V2-Lite's shape: no q_lora_rank; softmax, group-limited greedy, two shared experts;
    # mscale ≠ mscale_all_dim: the rotary tables carry their ratio
    "deepseek_v2": {
        **_DEEPSEEK,
        "q_lora_rank": None,
        "topk_method": "group_limited_greedy",
        "n_shared_experts": 2,
        "routed_scaling_factor": 1.5,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "mscale": 0.707,
            "mscale_all_dim": 0.8,
            "beta_fast": 32,
            "beta_slow": 1,
        },
    },
    # V3: q_lora_rank; sigmoid scores with e_score_correction_bias, renormalised, scaled 2.5
    "deepseek_v3": {
        **_DEEPSEEK,
        "q_lora_rank": 48,
        "n_shared_experts": 1,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "beta_fast": 32,
            "beta_slow": 1,
        },
    },
}


def _perturb(model: torch.nn.Module, seed: int) -> None:
    """Weights/biases ~ N(0, 0.15); norm weights ~ 1 + N(0, 0.2) (never all ones)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.2 * noise if "norm" in name else 0.15 * noise)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # a buffer in transformers
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))


def _save_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t1")
    fast.save_pretrained(str(folder))


def save_tiny(kind: str, folder: Path, seed: int = 0, **overrides: Any) -> Any:
    """Create, perturb and save a tiny `kind` ("llama" | "qwen2" | "qwen3", or a MOE_KINDS
    name with its MoE switches) model; return the HF model (float32, eval) as the oracle."""
    import transformers as tf

    config_cls, model_cls = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
        "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM),
        "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM),
        "qwen2_moe": (tf.Qwen2MoeConfig, tf.Qwen2MoeForCausalLM),
        "deepseek_v2": (tf.DeepseekV2Config, tf.DeepseekV2ForCausalLM),
        "deepseek_v3": (tf.DeepseekV3Config, tf.DeepseekV3ForCausalLM),
    }[kind]
    torch.manual_seed(seed)
    config = {**BASE, **MOE_KINDS.get(kind, {}), **DEEPSEEK_KINDS.get(kind, {}), **overrides}
    model = model_cls(config_cls(**config)).float().eval()
    _perturb(model, seed)
    model.save_pretrained(str(folder), safe_serialization=True)
    _save_tokenizer(folder)
    return model


def hf_last_logits(model: Any, ids: list[int]) -> torch.Tensor:
    """transformers' next-token logits for one unpadded prompt."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].float()


def random_prompts(lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in lengths]


class EngineBatch:
    """One batch of requests on an Engine, forwarded as the Scheduler would (no sampling)."""

    def __init__(self, engine: Any, prompts: list[list[int]]) -> None:
        from radixserve.engine.sampling import SamplingParams
        from radixserve.engine.scheduler.req import Req, StopCriteria
        from radixserve.engine.scheduler.schedule_batch import ScheduleBatch

        self.engine = engine
        self.reqs = [
            Req(
                rid=f"r{i}",
                origin_input_ids=list(ids),
                sampling_params=SamplingParams(),
                stop=StopCriteria(frozenset()),
            )
            for i, ids in enumerate(prompts)
        ]
        for req in self.reqs:
            req.init_next_round_input()
        self.batch = ScheduleBatch(self.reqs, engine.scheduler.kv)

    def _forward(self) -> torch.Tensor:
        runner = self.engine.runner
        fb = self.batch.to_forward_batch(runner.device, runner.attn_backend)
        return runner.forward(fb).next_token_logits.cpu()

    def prefill(self) -> torch.Tensor:
        self.batch.prepare_for_extend()
        return self._forward()

    def decode(self, tokens: list[int]) -> torch.Tensor:
        """Append one token per request and run a DECODE forward on it."""
        for req, tok in zip(self.reqs, tokens, strict=True):
            req.output_ids.append(tok)
        self.batch.prepare_for_decode()
        return self._forward()

    def release(self) -> None:
        """Give the KV slots and pool rows back so the engine can be reused."""
        for req in self.reqs:
            self.engine.scheduler.tree_cache.cache_finished_req(req)


@dataclass(frozen=True)
class Tiny:
    """A saved tiny checkpoint: transformers' model on it, our engine on it, and its folder."""

    hf: Any
    engine: Any
    folder: Path


@contextmanager
def tiny_models(
    tmp_path_factory: Any, save: Callable[[str, Path], Any], **engine_args: Any
) -> Iterator[Callable[[str], Tiny]]:
    """`get(name)`: the checkpoint `save(name, folder)` writes (returning transformers' model),
    saved and loaded by a float32 EngineCore once, on first use; every engine shut down at the
    end (for the tests' module-scoped `tiny` fixtures)."""
    from radixserve.engine import EngineCore

    built: dict[str, Tiny] = {}

    def get(name: str) -> Tiny:
        if name not in built:
            folder = tmp_path_factory.mktemp(name)
            hf = save(name, folder)
            engine = EngineCore(
                model_path=str(folder), max_total_tokens=2048, dtype="float32", **engine_args
            )
            built[name] = Tiny(hf, engine, folder)
        return built[name]

    try:
        yield get
    finally:
        for t in built.values():
            t.engine.shutdown()


def save_tiny_eagle(folder: Path, target: Any, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random EAGLE-1 draft head for the HF model `target` (a tiny Llama), saved as SGLang's
    `LlamaForCausalLMEagle` with EAGLE's tensor names (`fc.*`, `layers.0.*`, no input norm, no
    embedding or LM head: the target's are shared); returns its tensors."""
    import json

    from safetensors.torch import save_file

    c = target.config
    config = {
        **{k: v for k, v in c.to_dict().items() if not k.startswith("_")},
        "architectures": ["LlamaForCausalLMEagle"],
        "model_type": "llama",
        "num_hidden_layers": 1,
    }
    gen = torch.Generator().manual_seed(seed)
    h, inter = c.hidden_size, c.intermediate_size
    q, kv = (
        c.num_attention_heads * (h // c.num_attention_heads),
        c.num_key_value_heads * (h // c.num_attention_heads),
    )
    shapes = {
        "fc.weight": (h, 2 * h),
        "fc.bias": (h,),
        "layers.0.self_attn.q_proj.weight": (q, h),
        "layers.0.self_attn.k_proj.weight": (kv, h),
        "layers.0.self_attn.v_proj.weight": (kv, h),
        "layers.0.self_attn.o_proj.weight": (h, q),
        "layers.0.mlp.gate_proj.weight": (inter, h),
        "layers.0.mlp.up_proj.weight": (inter, h),
        "layers.0.mlp.down_proj.weight": (h, inter),
    }
    tensors = {n: 0.15 * torch.randn(s, generator=gen) for n, s in shapes.items()}
    tensors["layers.0.post_attention_layernorm.weight"] = 1 + 0.2 * torch.randn(h, generator=gen)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return tensors
