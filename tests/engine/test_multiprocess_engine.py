"""The offline Engine runs the server's processes and agrees with the in-process EngineCore;
its TokenizerManager streams deltas (each chunk carries only what is new)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import PROMPTS


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    from radixserve.engine import Engine

    with Engine(model_path="smollm2-135m", max_total_tokens=8192, dtype="float32") as eng:
        yield eng


def test_engine_matches_engine_core(smollm_engine: Any, engine: Any) -> None:
    params = {"temperature": 0, "max_new_tokens": 10, "stop": ["\n\n"]}
    expected = smollm_engine.generate(prompt=PROMPTS[:4], sampling_params=params)
    outs = engine.generate(prompt=PROMPTS[:4], sampling_params=params)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in expected]
    assert [o["text"] for o in outs] == [o["text"] for o in expected]
    assert [o["meta_info"]["finish_reason"] for o in outs] == [
        o["meta_info"]["finish_reason"] for o in expected
    ]
    with pytest.raises(ValueError, match="^temperature"):
        engine.generate(prompt="hi", sampling_params={"temperature": -1})
    single = engine.generate(prompt=PROMPTS[0], sampling_params=params)
    assert single["output_ids"] == expected[0]["output_ids"]
    assert engine.get_server_info()["page_size"] == 1


def test_stream_chunks_carry_only_their_delta(engine: Any) -> None:
    """Per-chunk cost proportional to the chunk: no chunk repeats earlier ids, text or
    logprobs, and the deltas add up to the non-stream result."""
    from radixserve.engine.entrypoints.request_builder import OutputOptions, Prompt, build_inputs

    n_tokens = 32
    params = {"temperature": 0, "max_new_tokens": n_tokens, "ignore_eos": True}
    whole = engine.generate(prompt=PROMPTS[1], sampling_params=params, return_logprob=True)
    ids = engine.tokenizer.encode(PROMPTS[1])
    options = OutputOptions(stream=True, return_logprob=True)
    (inp,) = build_inputs([Prompt(PROMPTS[1], ids)], [params], engine.state.limits, options)

    async def run() -> list[Any]:
        return [c async for c in engine.state.tokenizer_manager.generate(inp)]

    chunks = engine._run(run())
    assert len(chunks) >= n_tokens // 2  # streamed, not one final chunk
    assert max(len(c.output_ids) for c in chunks) <= 2  # deltas, not the cumulative list
    assert all(len(c.token_logprobs) == len(c.output_ids) for c in chunks)
    assert [t for c in chunks for t in c.output_ids] == whole["output_ids"]
    assert "".join(c.text_delta for c in chunks) == whole["text"]
    lps = [lp for c in chunks for lp in c.token_logprobs]
    assert lps == pytest.approx([e[0] for e in whole["meta_info"]["output_token_logprobs"]])
    assert chunks[-1].completion_tokens == n_tokens and chunks[-1].finish_reason is not None
