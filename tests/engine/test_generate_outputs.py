"""End-to-end `Engine.generate` on SmolLM2-135M: stopping, text shaping and logprobs.

Companion of test_generate_params.py. Each test holds a control (the unstopped / untrimmed /
default run) so it would fail if the parameter under test were ignored.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.engine.stop_oracle import mid_token_stop

PROMPT = "The capital of France is"
N_TOKENS = 24
GREEDY = {"temperature": 0, "max_new_tokens": N_TOKENS}
EOS = 2  # SmolLM2's <|im_end|>
EOS_TEXT = "<|im_end|>"


@pytest.fixture(scope="module")
def greedy_out(smollm_engine: Any) -> dict[str, Any]:
    out = smollm_engine.generate(prompt=PROMPT, sampling_params=GREEDY)
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": N_TOKENS}
    return out


@pytest.fixture(scope="module")
def chat_prompt(smollm_engine: Any) -> str:
    """A chat-formatted short question whose greedy answer ends with EOS early."""
    return smollm_engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )


@pytest.fixture(scope="module")
def chat_greedy(smollm_engine: Any, chat_prompt: str) -> list[int]:
    out = smollm_engine.generate(
        prompt=chat_prompt, sampling_params={**GREEDY, "max_new_tokens": 20}
    )
    ids = out["output_ids"]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
    assert ids[-1] == EOS and EOS not in ids[:-1] and len(ids) < 12
    return ids


# ---- stop strings / stop token ids / max_new_tokens -------------------------------------------


@pytest.mark.parametrize("stop", ["answer is", ["zzz-never", "answer is"]], ids=["str", "list"])
def test_stop_string(smollm_engine: Any, greedy_out: dict[str, Any], stop: str | list[str]) -> None:
    full = greedy_out["text"]
    needle = "answer is"
    at = full.find(needle)
    assert at > 0 and at + len(needle) < len(full), f"pick another stop string for {full!r}"
    outs = smollm_engine.generate(
        prompt=[PROMPT, PROMPT],
        sampling_params=[{**GREEDY, "stop": stop}, {**GREEDY, "stop": stop, "no_stop_trim": True}],
    )
    trimmed, kept = outs
    assert trimmed["text"] == full[:at]
    assert needle not in trimmed["text"]
    assert trimmed["meta_info"]["finish_reason"] == {"type": "stop", "matched": needle}
    assert trimmed["meta_info"]["completion_tokens"] < N_TOKENS
    assert trimmed["output_ids"] == greedy_out["output_ids"][: len(trimmed["output_ids"])]
    assert kept["text"].startswith(full[: at + len(needle)])
    assert full.startswith(kept["text"])
    assert kept["meta_info"]["finish_reason"] == {"type": "stop", "matched": needle}
    assert kept["output_ids"] == trimmed["output_ids"]


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_stop_string_ends_the_request_while_it_runs(
    smollm_engine: Any, greedy_out: dict[str, Any], overlap: bool
) -> None:
    """In process as in the server, a stop string ends the request in the scheduler while it
    generates: a fresh scheduler then caches the prompt and about the ids up to the stop, not
    the 300 the request was allowed; and its outputs are cut at the id that completed it."""
    case = mid_token_stop(smollm_engine.tokenizer, greedy_out["output_ids"])
    engine = smollm_engine.with_args(max_total_tokens=4096, disable_overlap_schedule=not overlap)
    try:
        params = {**GREEDY, "max_new_tokens": 300, "ignore_eos": True, "stop": case.stop}
        out = engine.generate(prompt=PROMPT, sampling_params=params, return_logprob=True)
        cached = engine.scheduler.tree_cache.evictable_size()
    finally:
        engine.shutdown()
    assert out["text"] == case.text
    assert out["output_ids"] == greedy_out["output_ids"][: case.num_ids]
    assert len(out["meta_info"]["output_token_logprobs"]) == case.num_ids
    assert out["meta_info"]["completion_tokens"] == case.num_ids
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": case.stop}
    assert cached <= len(smollm_engine.tokenizer.encode(PROMPT)) + case.num_ids + 2


def test_stop_token_ids(smollm_engine: Any, greedy_out: dict[str, Any]) -> None:
    ids = greedy_out["output_ids"]
    stop_id = ids[2]
    assert stop_id not in ids[:2] and stop_id != EOS
    outs = smollm_engine.generate(
        prompt=[PROMPT, PROMPT],
        sampling_params=[
            {**GREEDY, "stop_token_ids": [stop_id]},
            {**GREEDY, "stop_token_ids": [stop_id], "no_stop_trim": True},
        ],
    )
    tok = smollm_engine.tokenizer
    for out in outs:
        assert out["output_ids"] == ids[:3]
        assert out["meta_info"]["completion_tokens"] == 3
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert outs[0]["text"] == tok.decode(ids[:2], skip_special_tokens=True)
    assert outs[1]["text"] == tok.decode(ids[:3], skip_special_tokens=True)


def test_max_new_tokens_finishes_with_length(
    smollm_engine: Any, greedy_out: dict[str, Any]
) -> None:
    counts = [1, 5, 11]
    outs = smollm_engine.generate(
        prompt=[PROMPT] * len(counts),
        sampling_params=[{**GREEDY, "max_new_tokens": k} for k in counts],
    )
    for k, out in zip(counts, outs, strict=True):
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": k}
        assert out["meta_info"]["completion_tokens"] == k
        assert out["output_ids"] == greedy_out["output_ids"][:k]


# ---- EOS: min_new_tokens / ignore_eos / skip_special_tokens -----------------------------------


def test_min_new_tokens_and_ignore_eos(
    smollm_engine: Any, chat_prompt: str, chat_greedy: list[int]
) -> None:
    min_new = len(chat_greedy) + 4
    params = [
        {**GREEDY, "max_new_tokens": 20, "min_new_tokens": min_new},
        {**GREEDY, "max_new_tokens": 16, "ignore_eos": True},
    ]
    held, ignored = smollm_engine.generate(prompt=[chat_prompt] * 2, sampling_params=params)
    assert held["meta_info"]["completion_tokens"] >= min_new
    assert EOS not in held["output_ids"][:min_new]
    # Only EOS is masked: the tokens before it are the unconstrained greedy ones.
    assert held["output_ids"][: len(chat_greedy) - 1] == chat_greedy[:-1]

    assert ignored["meta_info"]["finish_reason"] == {"type": "length", "length": 16}
    assert ignored["meta_info"]["completion_tokens"] == 16
    assert ignored["output_ids"][: len(chat_greedy)] == chat_greedy  # ran straight through EOS


def test_skip_special_tokens_and_eos_trim(
    smollm_engine: Any, chat_prompt: str, chat_greedy: list[int]
) -> None:
    """The matched EOS is trimmed from the text unless no_stop_trim; then skip_special_tokens
    decides whether "<|im_end|>" shows."""
    cases = [
        {},
        {"skip_special_tokens": False},
        {"no_stop_trim": True},
        {"no_stop_trim": True, "skip_special_tokens": False},
    ]
    params = [{**GREEDY, "max_new_tokens": 20, **c} for c in cases]
    outs = smollm_engine.generate(prompt=[chat_prompt] * len(cases), sampling_params=params)
    default, unskipped, untrimmed, raw = (o["text"] for o in outs)
    for out in outs:
        assert out["output_ids"] == chat_greedy
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
    assert EOS_TEXT not in default and default.strip()
    assert unskipped == default
    assert untrimmed == default
    assert raw == default + EOS_TEXT


# ---- logprobs ---------------------------------------------------------------------------------


def test_logprobs_match_transformers(smollm_engine: Any, hf_smollm: Any) -> None:
    n_out = 8
    sampled = {"temperature": 1.5, "max_new_tokens": n_out, "sampling_seed": 11}
    outs = smollm_engine.generate(
        prompt=[PROMPT, PROMPT],
        sampling_params=[{**GREEDY, "max_new_tokens": n_out}, sampled],
        return_logprob=True,
        top_logprobs_num=3,
    )
    prompt_ids = smollm_engine.tokenizer.encode(PROMPT)
    for out in outs:
        ids = out["output_ids"]
        lps = out["meta_info"]["output_token_logprobs"]
        tops = out["meta_info"]["output_top_logprobs"]
        assert len(lps) == len(ids) == n_out
        assert [tid for _, tid, _ in lps] == ids
        assert all(lp <= 0.0 for lp, _, _ in lps)
        assert len(tops) == n_out
        for row in tops:
            assert len(row) == 3
            values = [v for v, _, _ in row]
            assert values == sorted(values, reverse=True)
        # Oracle: transformers on prompt + outputs, raw log_softmax at each predicting position.
        with torch.no_grad():
            logits = hf_smollm(torch.tensor([prompt_ids + ids])).logits[0].float()
        ref = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], dim=-1)
        for i, (lp, tid, _) in enumerate(lps):
            assert abs(lp - float(ref[i, tid])) < 1e-4, (i, lp, float(ref[i, tid]))
        assert [tid for _, tid, _ in tops[0]] == ref[0].topk(3).indices.tolist()

    greedy = outs[0]["meta_info"]
    for (lp, tid, _), row in zip(
        greedy["output_token_logprobs"], greedy["output_top_logprobs"], strict=True
    ):
        assert row[0][1] == tid
        assert abs(row[0][0] - lp) < 1e-6
    assert outs[1]["output_ids"] != outs[0]["output_ids"]  # the sampled row really sampled


def test_no_logprobs_unless_asked(smollm_engine: Any) -> None:
    out = smollm_engine.generate(prompt=PROMPT, sampling_params={**GREEDY, "max_new_tokens": 2})
    assert "output_token_logprobs" not in out["meta_info"]
    only_top = smollm_engine.generate(
        prompt=PROMPT, sampling_params={**GREEDY, "max_new_tokens": 2}, top_logprobs_num=2
    )
    assert len(only_top["meta_info"]["output_token_logprobs"]) == 2
    assert [len(r) for r in only_top["meta_info"]["output_top_logprobs"]] == [2, 2]
