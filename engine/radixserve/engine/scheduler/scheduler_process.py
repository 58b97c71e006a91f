"""The scheduler process: receives tokenized requests over ZMQ, runs the Scheduler, and
streams token-id outputs to the detokenizer (and control replies to the tokenizer manager).

Loop: drain inputs (block briefly only when idle) → dispatch by message type → one
scheduling step → publish KV events → send outputs. One process per rank: attention-TP rank 0
of each DP rank reads that DP rank's channel and broadcasts each round's inputs to its peers
(`tp_broadcast`); only it sends outputs and publishes KV events (on its DP rank's port, tagged
with its dp_rank). Under DP attention every round also agrees the step's token counts with the
other DP ranks (`Scheduler.step`), so an idle rank steps too. Model and Scheduler come from
`SchedulerCore`. Stop strings are not the scheduler's: the detokenizer finds them, and the
tokenizer manager sends a `FinishReq` that ends the request here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

import msgspec
import torch
import zmq

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.distributed import (
    ParallelGroups,
    RankSpec,
    destroy_parallel_groups,
    init_parallel_groups,
)
from radixserve.engine.ipc.channels import PortArgs, PullChannel, PushChannel
from radixserve.engine.ipc.messages import (
    AbortReq,
    BatchTokenIDOutput,
    ExpertDistributionReq,
    FinishReq,
    FlushCacheOutput,
    FlushCacheReq,
    GetLoadReq,
    GetStateReq,
    SchedulerInput,
    TokenizedGenerateReq,
)
from radixserve.engine.scheduler import input_logprobs
from radixserve.engine.scheduler.cpu_binding import bind_process_threads
from radixserve.engine.scheduler.expert_distribution_control import expert_distribution
from radixserve.engine.scheduler.kv_event_publisher import ZmqKVEventPublisher
from radixserve.engine.scheduler.req import Req
from radixserve.engine.scheduler.scheduler_core import SchedulerCore
from radixserve.engine.scheduler.tp_broadcast import (
    BroadcastSource,
    ChannelSource,
    DiscardSender,
    RequestSource,
    Sender,
)

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 20


@dataclass(frozen=True, slots=True)
class SchedulerChannels:
    recv: RequestSource
    to_detokenizer: Sender
    to_tokenizer: Sender


class SchedulerLoop:
    def __init__(
        self,
        core: SchedulerCore,
        channels: SchedulerChannels,
        publish_events: Callable[[], None] | None = None,
        dp_rank: int = 0,
    ) -> None:
        self.core = core
        self.dp_rank = dp_rank
        self.scheduler = core.scheduler
        self.ch = channels
        self.publish_events = publish_events
        self.handlers: dict[type, Callable[[Any], None]] = {
            TokenizedGenerateReq: self.handle_generate,
            AbortReq: self.handle_abort,
            FinishReq: self.handle_finish,
            FlushCacheReq: self.handle_flush,
            GetLoadReq: self.handle_get_load,
            GetStateReq: self.handle_get_state,
            ExpertDistributionReq: self.handle_expert_distribution,
        }
        self.pending: list[Req] = []  # finished without running (aborted, rejected)

    def run(self) -> None:
        """Serve until the process is terminated (the parent stops children by signal)."""
        while True:
            msgs = self.ch.recv.poll(self.scheduler.idle_poll_ms(IDLE_POLL_MS))
            for msg in msgs:
                self.handlers[type(msg)](msg)
            updated = []
            if self.scheduler.needs_step():
                started = time.perf_counter()
                updated = self.scheduler.step()
                if logger.isEnabledFor(logging.DEBUG):
                    self._log_step(time.perf_counter() - started, len(msgs))
            # Events first: a router that sees a response should already have (or be about to
            # get) the cache changes behind it, so the client's next turn routes here.
            if self.publish_events is not None:
                self.publish_events()
            self.send_outputs(self.pending + updated)
            self.pending = []

    def _log_step(self, seconds: float, received: int) -> None:
        """DEBUG: one line per forward (what ran, how long the whole step took, the queue)."""
        batch = self.scheduler.last_batch
        if batch is None:
            return
        logger.debug(
            "step mode=%s reqs=%d new_tokens=%d cached_tokens=%d waiting=%d received=%d ms=%.1f",
            batch.forward_mode.name.lower(),
            len(batch.reqs),
            sum(batch.extend_lens),
            sum(batch.prefix_lens) if batch.forward_mode.is_extend_like() else 0,
            len(self.scheduler.waiting_queue),
            received,
            seconds * 1000,
        )

    # ---- handlers -------------------------------------------------------------------------

    def handle_generate(self, msg: TokenizedGenerateReq) -> None:
        req = self.core.make_req(msg)
        self.scheduler.add_request(req)
        if req.finished():
            self.pending.append(req)

    def handle_abort(self, msg: AbortReq) -> None:
        self.pending += self.scheduler.abort_request(msg.rid, msg.abort_all)

    def handle_finish(self, msg: FinishReq) -> None:
        """The detokenizer ended the request on a stop string: end it here too."""
        self.pending += self.scheduler.abort_request(msg.rid, reason=msg.reason)

    def handle_flush(self, msg: FlushCacheReq) -> None:
        ok = self.scheduler.flush_cache()
        text = "" if ok else "cannot flush the cache while requests are running or queued"
        self.ch.to_tokenizer.send(FlushCacheOutput(ok, text))

    def handle_get_load(self, msg: GetLoadReq) -> None:
        self.ch.to_tokenizer.send(self.scheduler.load(self.dp_rank))

    def handle_expert_distribution(self, msg: ExpertDistributionReq) -> None:
        runner = self.scheduler.runner
        location = runner.eplb.location if runner.eplb is not None else runner.expert_location
        out = expert_distribution(runner.expert_recorder, msg.action, self.dp_rank, location)
        whole = runner.groups.dp_attention  # the MoE ran over every DP rank's tokens
        self.ch.to_tokenizer.send(msgspec.structs.replace(out, whole_model=whole))

    def handle_get_state(self, msg: GetStateReq) -> None:
        state = self.scheduler.state(msg.include_pages)
        self.ch.to_tokenizer.send(msgspec.structs.replace(state, dp_rank=self.dp_rank))

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
            fields["detokenize"].append(r.detokenize)
            fields["prompt_tail"].append(r.origin_input_ids[-5:])
            fields["output_token_logprobs"].append(r.output_token_logprobs[r.send_offset :])
            fields["output_top_logprobs"].append(r.output_top_logprobs[r.send_offset :])
            fields["input_logprobs"].append(input_logprobs.take(r))
            fields["queue_times"].append(r.queue_time)
            fields["spec_verify_ct"].append(r.spec_verify_ct)
            fields["spec_accepted_drafts"].append(r.spec_accepted_drafts)
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
    "detokenize",
    "prompt_tail",
    "output_token_logprobs",
    "output_top_logprobs",
    "input_logprobs",
    "queue_times",
    "spec_verify_ct",
    "spec_accepted_drafts",
)


def rank_args(args: ServerArgs, rank: RankSpec, dp_rank: int = 0) -> ServerArgs:
    """This rank's view: its own CUDA device; KV events only on attention-TP rank 0 of its DP
    rank (peers' trees are the same, and nothing would drain their events)."""
    if args.device.startswith("cuda") and args.num_ranks > 1:
        # one device per process: DP attention's ranks are global, otherwise DP groups stack
        index = rank.tp_rank if rank.attn_dp_size > 1 else dp_rank * rank.tp_size + rank.tp_rank
        args = replace(args, device=f"cuda:{index}")
    if not rank.is_first:
        args = replace(args, kv_events_port=None)
    return args


def _channels(
    ctx: zmq.Context[Any], ports: PortArgs, groups: ParallelGroups, dp: tuple[int, int]
) -> SchedulerChannels:
    """This rank's input (its DP rank's channel, or rank 0's broadcast) and output senders."""
    address = ports.scheduler_input_for(*dp)

    def pull() -> PullChannel:
        return PullChannel(ctx, address, bind=False, msg_type=SchedulerInput)

    attn = groups.attn_tp  # the ranks that schedule this DP rank's requests together
    if attn.size == 1:
        recv: RequestSource = ChannelSource(pull())
    else:
        recv = BroadcastSource(pull() if attn.is_first else None, groups.attn_cpu)
    if not attn.is_first:
        return SchedulerChannels(recv, DiscardSender(), DiscardSender())
    return SchedulerChannels(
        recv=recv,
        to_detokenizer=PushChannel(ctx, ports.detokenizer_input, bind=False),
        to_tokenizer=PushChannel(ctx, ports.tokenizer_input, bind=False),
    )


def _set_cpu_threads(args: ServerArgs, rank: RankSpec, dp_rank: int) -> None:
    """Ranks on one CPU share its cores: each takes its share of threads (without a cap each
    would start one per core), pinned to its own cores per --cpu-bind. A lone rank keeps
    torch's default (one per physical core) unless a cgroup quota allows fewer CPUs.
    `OMP_NUM_THREADS`, where set, is every rank's count."""
    if args.device != "cpu":
        return
    threads = args.cpu_threads(torch.get_num_threads())
    torch.set_num_threads(threads)
    index = rank.tp_rank if args.enable_dp_attention else dp_rank * args.tp_size + rank.tp_rank
    # With the overlap loop the forward runs on a worker thread, which would inherit the
    # main thread's single pinned CPU (and so would its OpenMP team): no binding there.
    spec = "none" if args.overlap_schedule else args.cpu_bind
    bind_process_threads(spec, index, args.num_ranks, threads)


def run_scheduler_process(
    args: ServerArgs,
    ports: PortArgs,
    ready: Connection,
    dp_rank: int = 0,
    rank: RankSpec | None = None,
) -> None:
    """Process entry point: join the TP group, build model + scheduler, report readiness,
    serve forever."""
    rank = rank or RankSpec()
    args = rank_args(args, rank, dp_rank)
    _set_cpu_threads(args, rank, dp_rank)
    ctx = zmq.Context()
    publisher = None
    try:
        if args.kv_events_port is not None:  # bind first: a taken port fails fast
            publisher = ZmqKVEventPublisher(
                args.host, args.kv_events_port, dp_rank, ctx=ctx, event_format=args.kv_events_format
            )
        groups = init_parallel_groups(rank, torch.device(args.device))
        core = SchedulerCore(args, groups=groups)
    except Exception as exc:  # report start-up failure to the parent instead of hanging it
        logger.exception("scheduler start-up failed")
        if publisher is not None:
            publisher.close()
        ready.send({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
        return
    channels = _channels(ctx, ports, groups, (dp_rank, args.dp_size))
    sched = core.scheduler
    ready.send(
        {"status": "ready", "dp_rank": dp_rank, "tp_rank": rank.tp_rank, **core.context_info()}
    )
    flush = publisher.make_flush(lambda: sched.tree_cache) if publisher is not None else None
    try:
        SchedulerLoop(core, channels, flush, dp_rank).run()
    finally:
        if publisher is not None:
            publisher.close()
        destroy_parallel_groups(groups)
