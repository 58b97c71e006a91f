"""`radixserve serve --tp-size 2` on a tiny Llama: two scheduler processes start, the server
answers the official `openai` client, and greedy completions equal the single-process run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.models.tiny import save_tiny
from tests.engine.server.live_server import live_server


def test_serve_tp2_answers_openai_client(tmp_path: Path) -> None:
    openai = pytest.importorskip("openai")
    from radixserve.engine import EngineCore

    folder = tmp_path / "llama"
    folder.mkdir()
    save_tiny("llama", folder, seed=5)
    prompt = [5, 9, 17, 33, 65, 129, 3, 7]
    core = EngineCore(model_path=str(folder), max_total_tokens=2048)
    want = core.generate(input_ids=prompt, sampling_params={"temperature": 0, "max_new_tokens": 8})
    core.shutdown()
    args = ("--model-path", str(folder), "--tp-size", "2", "--max-total-tokens", "2048")
    with live_server(*args, "--skip-server-warmup", log_dir=str(tmp_path)) as srv:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none")
        out = client.completions.create(
            model=client.models.list().data[0].id,
            prompt=prompt,
            max_tokens=8,
            temperature=0,
        )
        assert out.usage is not None
        assert out.usage.completion_tokens == len(want["output_ids"])
        assert out.choices[0].text == want["text"]
