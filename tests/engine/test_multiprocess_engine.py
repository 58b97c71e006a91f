"""The offline Engine runs the server's processes and agrees with the in-process EngineCore."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import PROMPTS


def test_engine_matches_engine_core(smollm_engine: Any) -> None:
    from radixserve.engine import Engine

    params = {"temperature": 0, "max_new_tokens": 10, "stop": ["\n\n"]}
    expected = smollm_engine.generate(prompt=PROMPTS[:4], sampling_params=params)
    with Engine(model_path="smollm2-135m", max_total_tokens=8192) as engine:
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
