"""A tiny random-weight Qwen3 that thinks: the real Qwen3 tokenizer and chat template, and weights
planted so that greedy decoding after the template's generation prompt writes a fixed chain,
`<think>` reasoning `</think>` `\\n\\n` answer `<|im_end|>`.

How: every token of the chain (and the prompt's last token, "\\n") gets its own basis direction
as its embedding, large next to everything else; the LM head row of the token that follows t is
a large multiple of t's direction (embeddings untied). The attention and MLP keep their random
initialisation: their small contributions go through the whole forward pass but cannot move the
argmax. As the next token depends on the current one only, each token of the chain must occur
once (so the reasoning does not open with "\\n", the prompt's last token).

With `enable_thinking: false` the template itself writes `<think>\\n\\n</think>\\n\\n`; the prompt
then ends with the chain's "\\n\\n", and the model goes on with the answer alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

THINK = "<think>Okay, the user says hi.\n</think>\n\nHello! How can I help?<|im_end|>"
PROMPT_END = "\n"  # the last token of the template's generation prompt "<|im_start|>assistant\n"
REASONING = "Okay, the user says hi.\n"
ANSWER = "Hello! How can I help?"
VOCAB = 151936  # Qwen3's padded vocab_size (the tokenizer has 151,669 tokens)
HIDDEN = 64
SCALE = 4.0  # the planted embeddings' norm (random ones are ~0.16)
LOGIT = 10.0  # LM head rows: ~LOGIT * sqrt(HIDDEN) for the planted next token
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def chain_ids(tokenizer: Any) -> list[int]:
    """The ids the model writes after the generation prompt: THINK, as the tokenizer splits it."""
    return list(tokenizer.encode(THINK, add_special_tokens=False))


def save_thinking_qwen3(folder: Path, tokenizer_dir: Path) -> list[int]:
    """Write the checkpoint (bfloat16 safetensors, config, the real tokenizer files) into
    `folder`; return the chain of ids it writes."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, folder / name)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    chain = chain_ids(tokenizer)
    (prompt_end,) = tokenizer.encode(PROMPT_END, add_special_tokens=False)
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.pad_token_id,  # <|endoftext|>, as in Qwen3's config
        eos_token_id=tokenizer.eos_token_id,
        dtype="bfloat16",
    )
    model = Qwen3ForCausalLM(config).eval()
    _plant(model, [prompt_end, *chain])
    model.to(torch.bfloat16).save_pretrained(str(folder), safe_serialization=True)
    return chain


def _plant(model: Any, sequence: list[int]) -> None:
    """Make `sequence[i + 1]` the greedy successor of `sequence[i]`."""
    if len(set(sequence)) != len(sequence) or len(sequence) > HIDDEN:
        raise ValueError("each token once, at most one per hidden dimension")
    embed = model.model.embed_tokens.weight
    head = model.lm_head.weight
    with torch.no_grad():
        for i, (token, successor) in enumerate(zip(sequence, sequence[1:], strict=False)):
            direction = torch.zeros(HIDDEN)
            direction[i] = 1.0
            embed[token] = SCALE * direction
            head[successor] = LOGIT * direction
