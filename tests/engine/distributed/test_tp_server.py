"""`radixserve serve --tp-size 2` on a tiny Llama: two scheduler processes start, the server
answers the official `openai` client with the single-process run's greedy completion, and a
dying rank takes the whole server down with no process left behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.engine.models.tiny import save_tiny
from tests.engine.server.live_server import live_server
from tests.engine.server.test_lifecycle import _alive, _children, _cmdline, _rss_kb


def test_serve_tp2_answers_openai_client(tmp_path: Path) -> None:
    openai = pytest.importorskip("openai")
    from radixserve.engine import EngineCore

    folder = tmp_path / "llama"
    folder.mkdir()
    save_tiny("llama", folder, seed=5)
    prompt = [5, 9, 17, 33, 65, 129, 3, 7]
    core = EngineCore(model_path=str(folder), max_total_tokens=2048, dtype="float32")
    want = core.generate(input_ids=prompt, sampling_params={"temperature": 0, "max_new_tokens": 8})
    core.shutdown()
    args = ("--model-path", str(folder), "--tp-size", "2", "--max-total-tokens", "2048")
    args += ("--dtype", "float32")  # compared with the float32 single-process run
    # KV events on: only rank 0 binds the publisher port (a peer binding it too would fail
    # start-up with "address in use").
    with live_server(*args, "--skip-server-warmup", log_dir=str(tmp_path), kv_ports=2) as srv:
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
        kids = _children(srv.proc.pid)
        workers = [k for k in kids if b"spawn_main" in _cmdline(k)]
        ranks = sorted(workers, key=_rss_kb)[-2:]  # the two model holders; the detokenizer is small
        assert len(workers) == 3
        os.kill(max(ranks), signal.SIGKILL)  # the later-spawned rank: a peer
        assert srv.proc.wait(60) != 0
        assert "child process died" in srv.log()
        time.sleep(1)
        assert not [k for k in kids if _alive(k)], "orphaned ranks"
