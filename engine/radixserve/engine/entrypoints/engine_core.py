"""EngineCore: the offline, in-process engine — a SchedulerCore (model, tokenizer, Scheduler
in the calling process) behind the same edge as the server: inputs validated once by
request_builder, outputs formatted by generation.native_output.

`generate(...)` blocks until every request finishes. Tests and benchmarks use it to compare
scheduler configurations on one set of loaded weights (`with_args`). For the server's process
layout without HTTP use `Engine`.
"""

from __future__ import annotations

from typing import Any

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.detokenizer.incremental_detokenizer import DecodeState, decode_finished
from radixserve.engine.entrypoints.generation import GenerateOutput, native_output
from radixserve.engine.entrypoints.request_builder import (
    OutputOptions,
    ServerLimits,
    build_inputs,
    native_prompts,
    per_prompt_params,
)
from radixserve.engine.scheduler.req import Req
from radixserve.engine.scheduler.scheduler_core import SchedulerCore
from radixserve.engine.tokenizer.io_struct import GenerateChunk


class EngineCore:
    def __init__(self, _core: SchedulerCore | None = None, **kwargs: Any) -> None:
        if _core is None:
            args = ServerArgs.from_kwargs(**kwargs)
            # Only the scheduler process's publisher drains RadixCache.events; in this process
            # nothing would, and the list would grow with every insert and eviction.
            if args.kv_events_port is not None:
                raise ValueError(
                    "kv_events_port: EngineCore publishes no KV events; use Engine or "
                    "`radixserve serve` with --kv-events-port"
                )
            _core = SchedulerCore(args)
        self.core = _core
        self.server_args = self.core.server_args
        self.tokenizer = self.core.tokenizer
        self.model_config = self.core.model_config
        self.runner = self.core.runner
        self.scheduler = self.core.scheduler
        info = self.core.context_info()
        self.limits = ServerLimits(
            info["context_len"], info["max_req_input_len"], self.model_config.vocab_size
        )

    def with_args(self, **overrides: Any) -> EngineCore:
        """A new engine sharing this one's loaded weights, with other scheduling / memory
        arguments (benchmarks and tests compare configurations without reloading)."""
        return EngineCore(self.core.with_args(**overrides))

    def generate(  # noqa: PLR0913 - sglang.Engine.generate's public signature
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """Generate for one prompt (→ dict) or a batch (→ list, n outputs per prompt)."""
        encode = lambda text: list(self.tokenizer.encode(text))  # noqa: E731
        prompts, single = native_prompts(encode, prompt, input_ids, text_field="prompt")
        params = per_prompt_params(sampling_params, len(prompts))
        options = OutputOptions(False, return_logprob, top_logprobs_num)
        inputs = build_inputs(prompts, params, self.limits, options, check_lengths=False)
        reqs = [self.core.make_req(inp.tokenized()) for inp in inputs]
        for req in reqs:
            self.scheduler.add_request(req)
        while not all(r.finished() for r in reqs):
            self.scheduler.step()
        # Drain bookkeeping of the last batch so the pool is back to idle.
        while self.scheduler.has_work():
            self.scheduler.step()
        want_lp = return_logprob or top_logprobs_num > 0
        outputs = [native_output(self._output(r), want_lp) for r in reqs]
        return outputs[0] if single and len(outputs) == 1 else outputs

    def _output(self, req: Req) -> GenerateOutput:
        """A finished Req as the one chunk the server would have streamed for it."""
        params = req.sampling_params
        state = DecodeState(params.skip_special_tokens, req.stop.stop_strs, params.no_stop_trim)
        text = decode_finished(
            self._decode, req.origin_input_ids, req.output_ids, req.finished_reason, state
        )
        out = GenerateOutput()
        out.add(
            GenerateChunk(
                rid=req.rid,
                text_delta=text,
                output_ids=list(req.output_ids),
                finish_reason=req.finished_reason,
                prompt_tokens=len(req.origin_input_ids),
                completion_tokens=len(req.output_ids),
                cached_tokens=req.cached_tokens,
                total_retractions=req.retraction_count,
                token_logprobs=list(req.output_token_logprobs),
                top_logprobs=list(req.output_top_logprobs),
            )
        )
        return out

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def shutdown(self) -> None:
        """Stop the forward worker and drop the KV pools (the weights may be shared with
        engines made by `with_args`, so they stay)."""
        self.core.close()

    def __enter__(self) -> EngineCore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
