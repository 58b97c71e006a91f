"""Live processes for the reliability tests: one engine on a tiny random-weight Llama (context
256, so every accepted request is cheap on CPU) and a router in front of it, shared per module."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine.server.live_server import LiveServer, live_server
from tests.router.router_proc import Router, router_proc

# A plain template (the word-level tokenizer has no special tokens but t0 / t1).
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant {% endif %}"
)


def save_tiny_checkpoint(folder: Path, kind: str = "llama") -> Path:
    """A tiny random-weight `kind` model whose tokenizer has a chat template."""
    from tests.engine.models.tiny import save_tiny

    save_tiny(kind, folder, seed=0)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def tiny_server(tiny_checkpoint: Path) -> Iterator[LiveServer]:
    with live_server(
        "--model-path", str(tiny_checkpoint), "--max-total-tokens", "8192",
        "--max-queued-requests", "256",
    ) as srv:  # fmt: skip
        yield srv


@pytest.fixture(scope="module")
def tiny_router(tiny_server: LiveServer) -> Iterator[Router]:
    with router_proc([tiny_server.base_url], healthy=1) as router:
        yield router
