"""A dead output loop must not hang the server: a malformed frame pushed into the tokenizer
manager's ZMQ input kills its output loop; every waiting client gets an answer at once and the
server exits non-zero, saying why."""

from __future__ import annotations

import glob
import json
import threading
import time
from pathlib import Path

import httpx
import zmq

from tests.engine.server.live_server import live_server

LONG = {"max_new_tokens": 4000, "ignore_eos": True, "temperature": 0}


def test_malformed_frame_fails_waiting_clients_and_exits_nonzero(tmp_path: Path) -> None:
    with live_server("--max-total-tokens", "8192", env={"TMPDIR": str(tmp_path)}) as srv:
        (sock_path,) = glob.glob(str(tmp_path / "radixserve-*" / "tokenizer"))
        results: dict[str, object] = {}

        def non_stream() -> None:
            body = {"text": "Count:", "sampling_params": LONG}
            r = httpx.post(srv.base_url + "/generate", json=body, timeout=60)
            results["non_stream"] = (r.status_code, r.json())

        def stream() -> None:
            body = {"text": "Count:", "sampling_params": LONG, "stream": True}
            events = []
            with httpx.stream("POST", srv.base_url + "/generate", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
            results["stream"] = events

        threads = [threading.Thread(target=f) for f in (non_stream, stream)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            load = httpx.get(srv.base_url + "/get_load", timeout=10).json()
            if load["num_running_reqs"] >= 2:
                break
            time.sleep(0.2)
        assert load["num_running_reqs"] >= 2, load

        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(f"ipc://{sock_path}")
        push.send(b"\xc1 this is not msgpack")
        push.close()
        ctx.term()

        for t in threads:
            t.join(15)
        assert not any(t.is_alive() for t in threads), "a waiting client was left hanging"
        status, body = results["non_stream"]  # type: ignore[misc]
        assert status == 500 and body["code"] == 500, body  # type: ignore[index]
        events = results["stream"]
        assert isinstance(events, list) and events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["code"] == 500
        assert srv.proc.wait(30) != 0
        log = srv.log()
        assert "output loop died" in log and "DecodeError" in log
