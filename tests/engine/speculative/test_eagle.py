"""EAGLE draft heads on the CPU: a tiny random EAGLE-1 head (SGLang's `LlamaForCausalLMEagle`,
EAGLE's tensor names, the target's embedding and LM head shared) for a tiny random Llama.

- Its drafts are the reference's: transformers' own LlamaDecoderLayer (no input norm), fc and
  the target's LM head, fed the target's final hidden states from transformers, give the same
  chain of tokens for the first verify of a request.
- Greedy outputs equal the plain engine's (its drafts are almost all rejected: random), with a
  cached prefix (the hidden states of a prefix computed by another request come from the
  target's per-slot store), pages of 1 and 16, and chunked prefill.
- A head of another hidden size, or none, is refused at start-up naming the flag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.models.tiny import random_prompts, save_tiny, save_tiny_eagle

STEPS = 3


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, dict[str, torch.Tensor]]:
    folder = tmp_path_factory.mktemp("eagle")
    hf = save_tiny("llama", folder / "target", seed=3)
    head = save_tiny_eagle(folder / "head", hf, seed=9)
    return folder, hf, head


def eagle_flags(folder: Path) -> dict[str, Any]:
    return {
        "speculative_algorithm": "EAGLE",
        "speculative_draft_model_path": str(folder / "head"),
        "speculative_num_steps": STEPS,
    }


def reference_chain(hf: Any, head: dict[str, torch.Tensor], ids: list[int]) -> list[int]:
    """The head's chain after `ids` (prompt + the first sampled token), with transformers:
    position i reads x_{i+1} and the target's f_i; further drafts read the head's own output."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = hf.config
    cfg._attn_implementation = "eager"
    layer = LlamaDecoderLayer(cfg, 0).float().eval()
    layer.load_state_dict(
        {k.removeprefix("layers.0."): v for k, v in head.items() if k.startswith("layers.0.")},
        strict=False,
    )
    layer.input_layernorm = torch.nn.Identity()  # EAGLE's first layer has none
    fc = torch.nn.Linear(2 * cfg.hidden_size, cfg.hidden_size)
    fc.load_state_dict({"weight": head["fc.weight"], "bias": head["fc.bias"]})
    rotary = LlamaRotaryEmbedding(cfg)
    with torch.no_grad():
        feats = hf.model(torch.tensor([ids[:-1]])).last_hidden_state[0]  # f_0 … f_{P-1}
        tokens, chain = list(ids[1:]), []
        for _ in range(STEPS):
            x = fc(torch.cat((hf.model.embed_tokens(torch.tensor(tokens)), feats), dim=-1))
            n = len(tokens)
            pos = torch.arange(n)[None]
            mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
            out = layer(x[None], attention_mask=mask, position_ids=pos,
                        position_embeddings=rotary(x[None], pos))  # fmt: skip
            g = (out[0] if isinstance(out, tuple) else out)[0, -1]
            draft = int(hf.lm_head(g).argmax())
            chain.append(draft)
            tokens.append(draft)
            feats = torch.cat((feats, g[None]))
    return chain


def test_drafts_are_the_reference_chain(models: tuple[Path, Any, dict[str, torch.Tensor]]) -> None:
    from radixserve.engine import EngineCore
    from radixserve.engine.scheduler.standalone_drafter import StandaloneDrafter

    folder, hf, head = models
    seen: list[tuple[list[int], list[int]]] = []
    fill = StandaloneDrafter.fill

    def recording(self: Any, reqs: Any, drafts: list[list[int]]) -> None:
        before = [r.full_ids() for r in reqs]
        fill(self, reqs, drafts)
        seen.extend(zip(before, [list(d) for d in drafts], strict=True))

    engine = EngineCore(
        model_path=str(folder / "target"), dtype="float32", max_total_tokens=2048,
        **eagle_flags(folder),
    )  # fmt: skip
    try:
        StandaloneDrafter.fill = recording  # type: ignore[method-assign]
        prompt = random_prompts((21,), seed=4)[0]
        engine.generate(input_ids=prompt, sampling_params={"temperature": 0, "max_new_tokens": 8})
    finally:
        StandaloneDrafter.fill = fill  # type: ignore[method-assign]
        engine.shutdown()
    assert len(seen) >= 2  # several verifies: the later ones caught the head's KV up
    for ids, drafts in seen:
        assert drafts == reference_chain(hf, head, ids)[: len(drafts)]  # fewer near the end


@pytest.mark.parametrize("page_size", [1, 16])
def test_greedy_outputs_equal_the_plain_engine(
    models: tuple[Path, Any, dict[str, torch.Tensor]], page_size: int
) -> None:
    from radixserve.engine import EngineCore

    folder, _, _ = models
    shared = random_prompts((40,), seed=7)[0]
    prompts = [shared + p for p in random_prompts((5, 9, 30), seed=8)]
    params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    args = {
        "model_path": str(folder / "target"), "dtype": "float32", "max_total_tokens": 4096,
        "page_size": page_size, "chunked_prefill_size": 32,
    }  # fmt: skip
    plain = EngineCore(**args)
    try:
        expected = [
            plain.generate(input_ids=p, sampling_params=params)["output_ids"] for p in prompts
        ]
    finally:
        plain.shutdown()
    spec = EngineCore(**args, **eagle_flags(folder))
    try:
        # one at a time: the later prompts find the shared prefix in the radix cache
        got = [spec.generate(input_ids=p, sampling_params=params)["output_ids"] for p in prompts]
        spec.scheduler.check_memory_invariant()
        stats = spec.scheduler.spec.stats
    finally:
        spec.shutdown()
    assert got == expected
    assert stats.verified_reqs >= len(prompts) * 3


def test_a_head_of_another_width_is_refused(
    models: tuple[Path, Any, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    from radixserve.engine import Engine

    folder, _, _ = models
    other = save_tiny("llama", tmp_path / "wide", seed=1, hidden_size=96)
    save_tiny_eagle(tmp_path / "wide-head", other)
    flags = {**eagle_flags(folder), "speculative_draft_model_path": str(tmp_path / "wide-head")}
    with pytest.raises(ValueError, match=r"^speculative_draft_model_path: the EAGLE head's hidden"):
        Engine(model_path=str(folder / "target"), **flags)
    with pytest.raises(ValueError, match=r"^speculative_draft_model_path: EAGLE needs a draft"):
        Engine(model_path=str(folder / "target"), speculative_algorithm="EAGLE")
