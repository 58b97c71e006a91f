"""The scheduler process: receives tokenized requests over ZMQ, runs the Scheduler, and
streams token-id outputs to the detokenizer (and control replies to the tokenizer manager).

Loop: drain inputs (block briefly only when idle) → dispatch by message type → one
scheduling step → publish KV events → send outputs. One scheduler process today (rank 0); the
model, tokenizer and Scheduler come from `SchedulerCore`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

import zmq

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.ipc.channels import PortArgs, PullChannel, PushChannel
from radixserve.engine.ipc.messages import (
    AbortReq,
    BatchTokenIDOutput,
    FlushCacheOutput,
    FlushCacheReq,
    GetLoadReq,
    GetStateReq,
    SchedulerInput,
    TokenizedGenerateReq,
)
from radixserve.engine.managers.kv_event_publisher import ZmqKVEventPublisher
from radixserve.engine.managers.req import Req
from radixserve.engine.managers.scheduler_core import SchedulerCore

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 20


@dataclass(frozen=True, slots=True)
class SchedulerChannels:
    recv: PullChannel
    to_detokenizer: PushChannel
    to_tokenizer: PushChannel


class SchedulerLoop:
    def __init__(
        self,
        core: SchedulerCore,
        channels: SchedulerChannels,
        publish_events: Callable[[], None] | None = None,
    ) -> None:
        self.core = core
        self.scheduler = core.scheduler
        self.ch = channels
        self.publish_events = publish_events
        self.handlers: dict[type, Callable[[Any], None]] = {
            TokenizedGenerateReq: self.handle_generate,
            AbortReq: self.handle_abort,
            FlushCacheReq: self.handle_flush,
            GetLoadReq: self.handle_get_load,
            GetStateReq: self.handle_get_state,
        }
        self.pending: list[Req] = []  # finished without running (aborted, rejected)

    def run(self) -> None:
        """Serve until the process is terminated (the parent stops children by signal)."""
        while True:
            idle = not self.scheduler.has_work()
            first = self.ch.recv.recv(IDLE_POLL_MS if idle else 0)
            msgs = [first, *self.ch.recv.drain()] if first is not None else []
            for msg in msgs:
                self.handlers[type(msg)](msg)
            updated = self.scheduler.step() if self.scheduler.has_work() else []
            # Events first: a router that sees a response should already have (or be about to
            # get) the cache changes behind it, so the client's next turn routes here.
            if self.publish_events is not None:
                self.publish_events()
            self.send_outputs(self.pending + updated)
            self.pending = []

    # ---- handlers -------------------------------------------------------------------------

    def handle_generate(self, msg: TokenizedGenerateReq) -> None:
        req = self.core.make_req(msg)
        self.scheduler.add_request(req)
        if req.finished():
            self.pending.append(req)

    def handle_abort(self, msg: AbortReq) -> None:
        self.pending += self.scheduler.abort_request(msg.rid, msg.abort_all)

    def handle_flush(self, msg: FlushCacheReq) -> None:
        ok = self.scheduler.flush_cache()
        text = "" if ok else "cannot flush the cache while requests are running or queued"
        self.ch.to_tokenizer.send(FlushCacheOutput(ok, text))

    def handle_get_load(self, msg: GetLoadReq) -> None:
        self.ch.to_tokenizer.send(self.scheduler.load())

    def handle_get_state(self, msg: GetStateReq) -> None:
        self.ch.to_tokenizer.send(self.scheduler.state(msg.include_pages))

    # ---- outputs --------------------------------------------------------------------------

    def send_outputs(self, reqs: list[Req]) -> None:
        out = [r for r in reqs if r.stream or r.finished()]
        if not out:
            return
        fields: dict[str, list[Any]] = {k: [] for k in _OUTPUT_FIELDS}
        for r in out:
            new = r.output_ids[r.send_offset :]
            fields["rids"].append(r.rid)
            fields["new_output_ids"].append(new)
            fields["finished_reasons"].append(r.finished_reason)
            fields["prompt_tokens"].append(len(r.origin_input_ids))
            fields["completion_tokens"].append(len(r.output_ids))
            fields["cached_tokens"].append(r.cached_tokens)
            fields["retractions"].append(r.retraction_count)
            fields["skip_special_tokens"].append(r.sampling_params.skip_special_tokens)
            fields["no_stop_trim"].append(r.sampling_params.no_stop_trim)
            fields["stop_strs"].append(list(r.stop.stop_strs))
            fields["prompt_tail"].append(r.origin_input_ids[-5:])
            fields["output_token_logprobs"].append(r.output_token_logprobs[r.send_offset :])
            fields["output_top_logprobs"].append(r.output_top_logprobs[r.send_offset :])
            r.send_offset = len(r.output_ids)
        self.ch.to_detokenizer.send(BatchTokenIDOutput(**fields))


_OUTPUT_FIELDS = (
    "rids",
    "new_output_ids",
    "finished_reasons",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "retractions",
    "skip_special_tokens",
    "no_stop_trim",
    "stop_strs",
    "prompt_tail",
    "output_token_logprobs",
    "output_top_logprobs",
)


def run_scheduler_process(
    args: ServerArgs, ports: PortArgs, ready: Connection, dp_rank: int = 0
) -> None:
    """Process entry point: build model + scheduler, report readiness, serve forever."""
    if args.kv_events_port is not None and not args.enable_kv_events:
        args = replace(args, enable_kv_events=True)
    ctx = zmq.Context()
    publisher = None
    try:
        if args.kv_events_port is not None:  # bind first: a taken port fails fast
            publisher = ZmqKVEventPublisher(args.host, args.kv_events_port, dp_rank, ctx=ctx)
        core = SchedulerCore(args)
    except Exception as exc:  # report start-up failure to the parent instead of hanging it
        logger.exception("scheduler start-up failed")
        if publisher is not None:
            publisher.close()
        ready.send({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
        return
    channels = SchedulerChannels(
        recv=PullChannel(ctx, ports.scheduler_input, bind=False, msg_type=SchedulerInput),
        to_detokenizer=PushChannel(ctx, ports.detokenizer_input, bind=False),
        to_tokenizer=PushChannel(ctx, ports.tokenizer_input, bind=False),
    )
    sched = core.scheduler
    ready.send({"status": "ready", "dp_rank": dp_rank, **core.context_info()})
    flush = publisher.make_flush(lambda: sched.tree_cache) if publisher is not None else None
    try:
        SchedulerLoop(core, channels, flush).run()
    finally:
        if publisher is not None:
            publisher.close()
