"""The offline Engine runs the server's processes and agrees with the in-process EngineCore;
its TokenizerManager streams deltas (each chunk carries only what is new)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.conftest import PROMPTS
from tests.engine.stop_oracle import mid_token_stop


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


@pytest.fixture(scope="module")
def overlap_engine() -> Iterator[Any]:
    from radixserve.engine import Engine

    with Engine(
        model_path="smollm2-135m",
        max_total_tokens=8192,
        dtype="float32",
        disable_overlap_schedule=False,  # on, also on the CPU
    ) as eng:
        yield eng


def stream(engine: Any, prompt: str, params: dict[str, Any]) -> list[Any]:
    """The GenerateChunks of one streamed request, as the HTTP routes get them."""
    from radixserve.engine.entrypoints.request_builder import OutputOptions, Prompt, build_inputs

    ids = engine.tokenizer.encode(prompt)
    options = OutputOptions(stream=True, return_logprob=True)
    (inp,) = build_inputs([Prompt(prompt, ids)], [params], engine.state.limits, options)

    async def run() -> list[Any]:
        return [c async for c in engine.state.tokenizer_manager.generate(inp)]

    return list(engine._run(run()))


def test_stream_chunks_carry_only_their_delta(engine: Any) -> None:
    """Per-chunk cost proportional to the chunk: no chunk repeats earlier ids, text or
    logprobs, and the deltas add up to the non-stream result."""
    n_tokens = 32
    params = {"temperature": 0, "max_new_tokens": n_tokens, "ignore_eos": True}
    whole = engine.generate(prompt=PROMPTS[1], sampling_params=params, return_logprob=True)
    chunks = stream(engine, PROMPTS[1], params)
    assert len(chunks) >= n_tokens // 2  # streamed, not one final chunk
    assert max(len(c.output_ids) for c in chunks) <= 2  # deltas, not the cumulative list
    assert all(len(c.token_logprobs) == len(c.output_ids) for c in chunks)
    assert [t for c in chunks for t in c.output_ids] == whole["output_ids"]
    assert "".join(c.text_delta for c in chunks) == whole["text"]
    lps = [lp for c in chunks for lp in c.token_logprobs]
    assert lps == pytest.approx([e[0] for e in whole["meta_info"]["output_token_logprobs"]])
    assert chunks[-1].completion_tokens == n_tokens and chunks[-1].finish_reason is not None


@pytest.mark.parametrize("name", ["engine", "overlap_engine"])
def test_streamed_stop_string_ends_the_request(request: pytest.FixtureRequest, name: str) -> None:
    """The server's processes, overlap off and on: the stream carries exactly the text before
    the stop string and the ids (and logprobs) up to the one that completed it, and the
    scheduler stops the request: once idle, its cache holds about those ids, not the 300 the
    request was allowed."""
    from radixserve.engine.ipc.finish_reason import FinishMatchedStr

    eng = request.getfixturevalue(name)
    greedy = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    unstopped = eng.generate(prompt=PROMPTS[0], sampling_params=greedy)["output_ids"]
    case = mid_token_stop(eng.tokenizer, unstopped)
    wait_until(eng.flush_cache)
    chunks = stream(eng, PROMPTS[0], {**greedy, "max_new_tokens": 300, "stop": case.stop})
    text = ""
    for chunk in chunks:
        text += chunk.text_delta
        assert case.text.startswith(text)  # no start of the stop string is ever sent
    assert text == case.text
    assert [t for c in chunks for t in c.output_ids] == unstopped[: case.num_ids]
    assert sum(len(c.token_logprobs) for c in chunks) == case.num_ids
    assert chunks[-1].finish_reason == FinishMatchedStr(case.stop)
    assert chunks[-1].completion_tokens == case.num_ids
    wait_until(lambda: eng.get_load()[0]["num_reqs"] == 0)
    assert sum(eng.cached_tokens_per_rank()) < len(eng.tokenizer.encode(PROMPTS[0])) + 150


def wait_until(cond: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)
