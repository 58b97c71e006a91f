"""`radixserve bench router-overhead` as a user runs it (the CLI in a subprocess), short: the fake
engines serve a capture written here (a word-level tokenizer and a chat template in the
engine's /get_tokenizer shape, a chat answer, a three-event stream), our router is started in
front of them and again as a peer command, and every chat of every row, plain and streamed,
straight to the fakes and through each router, is answered whole. The report names each
router's CPU per request and the latency it adds over the fakes alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

from radixserve.bench.router_capture import Capture, load_capture, save_capture
from tests.child_env import child_env
from tests.ports import free_port_run

TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
CHUNK = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"}}]}


def toy_capture() -> Capture:
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "user": 3, "system": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = {
        "tokenizer_json": tok.to_str(),
        "chat_template": TEMPLATE,
        "special_tokens": {"bos_token": "<s>", "eos_token": "</s>"},
    }
    chat = {"object": "chat.completion", "choices": [{"index": 0, "message": {"content": "hi"}}]}
    return Capture(
        server_info={"page_size": 1, "dp_size": 1, "max_total_num_tokens": 100_000},
        model_info={"served_model_name": "toy"},
        load={"dp_rank": 0, "num_reqs": 0},
        models={"object": "list", "data": [{"id": "toy", "object": "model"}]},
        tokenizer=json.dumps(tokenizer),
        chat=json.dumps(chat),
        stream=[f"data: {json.dumps(CHUNK)}\n\n"] * 2 + ["data: [DONE]\n\n"],
    )


def test_router_overhead_serves_every_chat_and_reports_each_row(tmp_path: Path) -> None:
    capture, out = tmp_path / "capture.json", tmp_path / "overhead.json"
    save_capture(toy_capture(), capture)
    assert load_capture(capture) == toy_capture()
    cmd = [
        sys.executable, "-m", "radixserve.cli", "bench", "router-overhead",
        "--capture-file", str(capture), "--routers", "direct,radixserve",
        "--concurrency", "1,8", "--requests", "40", "--warmup-requests", "8",
        "--tenants", "2", "--system-words", "20", "--base-port", str(free_port_run(11)),
        "--output-file", str(out), "--peer-name", "again", "--peer-router-cmd",
        f"{Path(sys.executable).with_name('radixserve')} router --worker-urls {{worker_urls}} "
        "--port {port}",
    ]  # fmt: skip
    # run outside the repository: its top-level operator/ would shadow the stdlib's `operator`
    run = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=child_env()
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    keys = [(r["router"], r["mode"], r["concurrency"]) for r in rows]
    assert keys == [
        (router, mode, c)
        for router in ("direct", "radixserve", "again")
        for mode in ("plain", "stream")
        for c in (1, 8)
    ]
    for row in rows:
        assert (row["ok"], row["failed"], row["errors"]) == (40, 0, []), row
        if row["router"] != "direct":
            # a number (40 requests may fit in one 10 ms tick of /proc's CPU clock: 0.0)
            assert isinstance(row["cpu_ms_per_req"], float) and "added_p99_ms" in row, row
        else:
            assert row["cpu_ms_per_req"] is None, row
    assert "router overhead: 40 chats per row" in run.stdout
