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

import msgspec

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.entrypoints.generation import collect, native_output
from radixserve.engine.entrypoints.launch import launch_subprocesses
from radixserve.engine.entrypoints.request_builder import (
    OutputOptions,
    build_inputs,
    native_prompts,
    per_prompt_params,
)
from radixserve.engine.entrypoints.serve import build_state
from radixserve.engine.ipc.messages import LoadOutput


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
        logprob_start_len: int = -1,
        data_parallel_rank: int | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """Same contract as EngineCore.generate; bad input raises ValueError naming the field."""
        tm = self.state.tokenizer_manager
        prompts, single = native_prompts(tm.tokenize, prompt, input_ids, text_field="prompt")
        params = per_prompt_params(sampling_params, len(prompts))
        options = OutputOptions(
            False,
            return_logprob,
            top_logprobs_num,
            data_parallel_rank,
            logprob_start_len=logprob_start_len,
        )
        inputs = build_inputs(prompts, params, self.state.limits, options)
        results = self._run(collect(tm, inputs))
        want_lp = return_logprob or top_logprobs_num > 0
        outs = [native_output(r, want_lp) for r in results]
        return outs[0] if single and len(outs) == 1 else outs

    def get_server_info(self) -> dict[str, Any]:
        return self.state.server_info()

    def flush_cache(self) -> bool:
        return bool(self._run(self.state.tokenizer_manager.flush_cache()).success)

    def expert_distribution(self, action: str) -> dict[str, Any]:
        """start | stop | dump the expert distribution recorder (as its HTTP endpoints);
        raises ValueError with the engine's reason when it refuses."""
        out = self._run(self.state.tokenizer_manager.expert_distribution(action))
        if not out.success:
            raise ValueError(out.message)
        return {
            "path": out.message,
            "logical_count": out.counts,
            "physical_count": out.physical_counts,
            "physical_to_logical_map": out.physical_to_logical_map,
        }

    def get_load(self) -> list[dict[str, Any]]:
        """Each DP rank's scheduler load (running, queued, tokens), by dp_rank."""
        loads = self._run(self.state.tokenizer_manager.get_load())
        return [_plain(load) for load in loads]

    def cached_tokens_per_rank(self) -> list[int]:
        """Tokens each DP rank's radix cache holds now (evictable + in use by requests)."""
        states = self._run(self.state.tokenizer_manager.get_state())
        return [s.evictable_tokens + s.protected_tokens for s in states]

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


def _plain(load: LoadOutput) -> dict[str, Any]:
    """A load as plain dicts, HiCache's and the experts' nested parts included."""
    return msgspec.to_builtins(load)
