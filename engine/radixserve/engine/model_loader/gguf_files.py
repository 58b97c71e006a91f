"""Reads a GGUF file: architecture metadata as a HF-style config dict, and dequantized tensors
under HuggingFace parameter names.

llama.cpp's converter permutes Llama's q/k projection rows for its own rotary layout; we undo
that here exactly as transformers does, so the rest of the engine sees HF weights.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def open_reader(path: Path) -> Any:
    """A `gguf.GGUFReader` (slow to build: it parses all metadata); pass it to the readers
    below to parse a file once."""
    import gguf  # optional dependency of the engine extra

    return gguf.GGUFReader(str(path))


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def read_gguf_config(path: Path, reader: Any = None) -> dict[str, Any]:
    """Architecture metadata → a dict shaped like a HuggingFace config.json."""
    reader = reader if reader is not None else open_reader(path)
    arch = _field(reader, "general.architecture")
    if arch not in _ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; known: {sorted(_ARCHITECTURES)}"
        )
    p = f"{arch}."
    heads = int(_field(reader, p + "attention.head_count"))
    hidden = int(_field(reader, p + "embedding_length"))
    tensor_names = {t.name for t in reader.tensors}
    vocab = _field(reader, p + "vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    return {
        "architectures": [_ARCHITECTURES[arch]],
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, p + "feed_forward_length")),
        "num_hidden_layers": int(_field(reader, p + "block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, p + "attention.head_count_kv", heads)),
        "head_dim": int(_field(reader, p + "attention.key_length", hidden // heads)),
        "vocab_size": int(vocab),
        "rms_norm_eps": float(_field(reader, p + "attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(_field(reader, p + "rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_field(reader, p + "context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
    }


def _hf_name(gguf_name: str) -> str | None:
    m = _BLOCK.match(gguf_name)
    if m:
        layer, part, kind = m.groups()
        mapped = _LAYER_NAMES.get(part)
        return f"model.layers.{layer}.{mapped}.{kind}" if mapped else None
    stem, _, kind = gguf_name.rpartition(".")
    mapped = _GLOBAL_NAMES.get(stem)
    return f"{mapped}.{kind}" if mapped else None


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    # Inverse of llama.cpp's `permute`: rows were interleaved per head for its rotary layout.
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def dequantized_bytes(reader: Any) -> int:
    """What every tensor of the file takes once dequantized to float32."""
    return sum(4 * int(np.prod(t.shape)) for t in reader.tensors)


def iter_gguf_tensors(
    path: Path, config: dict[str, Any], reader: Any = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, float32 tensor) for every tensor we know, dequantized."""
    from gguf.quants import dequantize

    reader = reader if reader is not None else open_reader(path)
    is_llama = config["architectures"][0] == "LlamaForCausalLM"
    for t in reader.tensors:
        name = _hf_name(t.name)
        if name is None:
            continue
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if is_llama and name.endswith("q_proj.weight"):
            w = _unpermute(w, config["num_attention_heads"])
        elif is_llama and name.endswith("k_proj.weight"):
            w = _unpermute(w, config["num_key_value_heads"])
        yield name, torch.from_numpy(np.array(w, dtype=np.float32))  # owned, writable copy
