"""Engine: the offline API shaped like `sglang.Engine`, over the same processes as the
server (scheduler + detokenizer, ZMQ), without HTTP.

The TokenizerManager runs on a private asyncio loop in a background thread; `generate`
blocks the caller until every request of the call finishes. For the in-process variant
(model and scheduler in this process) use `EngineCore`.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.entrypoints.generation import collect, expand_n
from radixserve.engine.entrypoints.http_server import native_output
from radixserve.engine.entrypoints.launch import launch_subprocesses
from radixserve.engine.entrypoints.request_builder import normalize_inputs
from radixserve.engine.entrypoints.serve import build_state
from radixserve.engine.managers.tokenizer_manager import GenerateInput


class Engine:
    def __init__(self, **kwargs: Any) -> None:
        self.server_args = args = ServerArgs.from_kwargs(**kwargs)
        self.children = launch_subprocesses(args)
        try:
            self.state = build_state(args, self.children)
        except Exception:
            self.children.shutdown()
            raise
        self.tokenizer = self.state.tokenizer
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="radixserve-engine", daemon=True
        )
        self.thread.start()
        self._run(self.state.tokenizer_manager.start())

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def generate(  # noqa: PLR0913 - sglang.Engine.generate's public signature
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """Same contract as EngineCore.generate; bad input raises ValueError naming the field."""
        batch = normalize_inputs(self.tokenizer, prompt, input_ids, sampling_params)
        want_lp = return_logprob or top_logprobs_num > 0
        inputs = expand_n(
            [
                GenerateInput(ids, dict(params), text, False, want_lp, top_logprobs_num)
                for text, ids, params in zip(
                    batch.texts, batch.input_ids, batch.params, strict=True
                )
            ]
        )
        chunks = self._run(collect(self.state.tokenizer_manager, inputs))
        outs = [native_output(c, want_lp) for c in chunks]
        return outs[0] if batch.is_single and len(outs) == 1 else outs

    def get_server_info(self) -> dict[str, Any]:
        return self.state.server_info()

    def flush_cache(self) -> bool:
        return bool(self._run(self.state.tokenizer_manager.flush_cache()).success)

    def shutdown(self) -> None:
        """Stop the loop and the child processes; safe to call twice."""
        if self.loop.is_running():
            self._run(self.state.tokenizer_manager.stop())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
        self.children.shutdown()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
