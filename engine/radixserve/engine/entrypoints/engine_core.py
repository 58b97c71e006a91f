"""EngineCore: the offline, in-process engine — a SchedulerCore (model and Scheduler in the
calling process) behind the same edge as the server: inputs validated once by
request_builder, outputs formatted by generation.native_output. It plays the text side too:
after each scheduler step the incremental detokenizer takes the new ids of each request that has
stop strings, and a stop string ends the request in the scheduler at once, as the server's
detokenizer does (the ids after the one that completed it are dropped).

`generate(...)` blocks until every request finishes. Tests and benchmarks use it to compare
scheduler configurations on one set of loaded weights (`with_args`). For the server's process
layout without HTTP use `Engine`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.detokenizer.incremental_detokenizer import (
    DecodeState,
    IncrementalDetokenizer,
)
from radixserve.engine.entrypoints.generation import GenerateOutput, native_output
from radixserve.engine.entrypoints.request_builder import (
    OutputOptions,
    ServerLimits,
    build_inputs,
    native_prompts,
    per_prompt_params,
)
from radixserve.engine.ipc.finish_reason import FinishReason
from radixserve.engine.model_loader.loader import load_tokenizer
from radixserve.engine.scheduler import input_logprobs
from radixserve.engine.scheduler.req import Req
from radixserve.engine.scheduler.scheduler_core import SchedulerCore
from radixserve.engine.tokenizer.io_struct import GenerateChunk


@dataclass(slots=True)
class RequestText:
    """What the detokenizer keeps of one request, here in process."""

    state: DecodeState
    deltas: list[str] = field(default_factory=list)
    num_ids: int = 0  # output ids taken (once finished: the ids the request keeps)
    finish: FinishReason | None = None


class EngineCore:
    def __init__(
        self, _core: SchedulerCore | None = None, _tokenizer: Any = None, **kwargs: Any
    ) -> None:
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
        # the grammar backend's cached loader where there is one: one tokenizer for both
        shared = _core.load_tokenizer
        self.tokenizer = _tokenizer or (shared() if shared else load_tokenizer(_core.source))
        self.detok = IncrementalDetokenizer.for_tokenizer(self.tokenizer)
        self.model_config = self.core.model_config
        self.runner = self.core.runner
        self.scheduler = self.core.scheduler
        info = self.core.context_info()
        self.limits = ServerLimits(
            info["context_len"],
            info["max_req_input_len"],
            self.model_config.vocab_size,
            grammar_backend=self.server_args.grammar_backend,
        )

    def with_args(self, **overrides: Any) -> EngineCore:
        """A new engine sharing this one's loaded weights, with other scheduling / memory
        arguments (benchmarks and tests compare configurations without reloading)."""
        return EngineCore(self.core.with_args(**overrides), self.tokenizer)

    def generate(  # noqa: PLR0913 - sglang.Engine.generate's public signature
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        logprob_start_len: int = -1,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """Generate for one prompt (→ dict) or a batch (→ list, n outputs per prompt)."""
        encode = lambda text: list(self.tokenizer.encode(text))  # noqa: E731
        prompts, single = native_prompts(encode, prompt, input_ids, text_field="prompt")
        params = per_prompt_params(sampling_params, len(prompts))
        options = OutputOptions(
            False, return_logprob, top_logprobs_num, logprob_start_len=logprob_start_len
        )
        inputs = build_inputs(prompts, params, self.limits, options, check_lengths=False)
        msgs = [inp.tokenized(self.tokenizer.eos_token_id) for inp in inputs]
        reqs = [self.core.make_req(msg) for msg in msgs]
        texts = [RequestText(self.detok.start(msg.input_ids, msg.detokenize)) for msg in msgs]
        for req in reqs:
            self.scheduler.add_request(req)
        watched = [(r, t) for r, t in zip(reqs, texts, strict=True) if t.state.stop.strs]
        while not all(r.finished() for r in reqs):
            self.scheduler.step()
            for req, text in watched:
                self._take_new_ids(req, text)
        # Drain bookkeeping of the last batch so the pool is back to idle.
        while self.scheduler.has_work():
            self.scheduler.step()
        for req, text in zip(reqs, texts, strict=True):
            self._take_new_ids(req, text)
        want_lp = return_logprob or top_logprobs_num > 0
        outputs = [
            native_output(self._output(r, t), want_lp) for r, t in zip(reqs, texts, strict=True)
        ]
        return outputs[0] if single and len(outputs) == 1 else outputs

    def _take_new_ids(self, req: Req, text: RequestText) -> None:
        """Run the request's ids since the last call through the detokenizer; a stop string
        found there ends the request in the scheduler, as the server's FinishReq does."""
        new = req.output_ids[text.num_ids :]
        if text.finish is not None or not (new or req.finished()):
            return
        step = self.detok.step(text.state, new, req.finished_reason)
        text.deltas.append(step.delta)
        text.num_ids += step.num_ids
        text.finish = step.finish
        if step.finish is not None and not req.finished():
            self.scheduler.abort_request(req.rid, reason=step.finish)

    @staticmethod
    def _output(req: Req, text: RequestText) -> GenerateOutput:
        """A finished request as the one chunk the server would have streamed for it."""
        n = text.num_ids
        out = GenerateOutput()
        out.add(
            GenerateChunk(
                rid=req.rid,
                text_delta="".join(text.deltas),
                output_ids=req.output_ids[:n],
                finish_reason=text.finish,
                prompt_tokens=len(req.origin_input_ids),
                completion_tokens=n,
                cached_tokens=req.cached_tokens,
                total_retractions=req.retraction_count,
                token_logprobs=req.output_token_logprobs[:n],
                top_logprobs=req.output_top_logprobs[:n],
                input_logprobs=input_logprobs.take(req),
                spec_verify_ct=req.spec_verify_ct,
                spec_accepted_drafts=req.spec_accepted_drafts,
            )
        )
        return out

    def shutdown(self) -> None:
        """Stop the forward worker and drop the KV pools (the weights may be shared with
        engines made by `with_args`, so they stay)."""
        self.core.close()

    def __enter__(self) -> EngineCore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
