"""Scheduler: continuous batching over one ModelRunner (the loop of one rank).

Each `step()`: finish bookkeeping of the last prefill (merge it into the running batch),
try a new prefill batch (prefill has priority), otherwise run one decode step, hand it to
the ModelWorker (forward + sampling) and process results. Memory pressure during decode
retracts requests back to the queue. It is driven in-process by the offline Engine or by
the scheduler process loop.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import replace
from functools import partial

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.constrained import BaseGrammarBackend
from radixserve.engine.forward_batch import DpAttentionMeta, ForwardMode
from radixserve.engine.ipc.finish_reason import FinishAbort, FinishReason
from radixserve.engine.ipc.messages import LoadOutput, StateOutput
from radixserve.engine.mem_cache.base_prefix_cache import BasePrefixCache
from radixserve.engine.mem_cache.radix_cache import RadixCache
from radixserve.engine.model_executor.model_runner import ModelRunner
from radixserve.engine.model_executor.model_worker import GenerationBatch, ModelWorker
from radixserve.engine.sampling import SamplingBatchInfo, SamplingRow
from radixserve.engine.scheduler import input_logprobs
from radixserve.engine.scheduler.disagg import make_disagg
from radixserve.engine.scheduler.disagg_decode import DecodeDisagg
from radixserve.engine.scheduler.disagg_prefill import PrefillDisagg
from radixserve.engine.scheduler.dp_attention_sync import DpAttentionSync
from radixserve.engine.scheduler.grammar_queue import GRAMMAR_POLL_S, GrammarQueue, PendingMask
from radixserve.engine.scheduler.overlap import ForwardWorker, FutureMap, InflightBatch
from radixserve.engine.scheduler.prefill_adder import AddReqResult, PrefillAdder, PrefillBudget
from radixserve.engine.scheduler.prefix_match import (
    StepPrefixMatches,
    WaitingPins,
    prefix_match_key,
)
from radixserve.engine.scheduler.req import Req
from radixserve.engine.scheduler.retraction import NewTokenRatio, retract_decode
from radixserve.engine.scheduler.schedule_batch import KVContext, ScheduleBatch
from radixserve.engine.scheduler.schedule_policy import SchedulePolicy
from radixserve.engine.scheduler.speculation import Speculator
from radixserve.engine.scheduler.standalone_drafter import StandaloneDrafter
from radixserve.engine.scheduler.tree_cache_setup import hicache_load, make_tree_cache
from radixserve.engine.speculative import VerifyOutput

logger = logging.getLogger(__name__)

ABORTED = FinishAbort("aborted by request", 400)
PD_POLL_MS = 2  # PD rooms waiting on their peer: how often their sockets are read
PREFETCH_POLL_S = 0.002  # an idle round with storage prefetches unfinished waits this long


class Scheduler:
    def __init__(
        self,
        args: ServerArgs,
        runner: ModelRunner,
        grammar_backend: BaseGrammarBackend | None = None,
        draft_runner: ModelRunner | None = None,
    ) -> None:
        self.args = args
        self.runner = runner
        tree_cache = make_tree_cache(args, runner)
        self.kv = KVContext(
            runner.req_to_token_pool, runner.token_to_kv_pool, runner.allocator, tree_cache
        )
        self.max_total_tokens = runner.sizes.max_total_tokens
        self.max_running_requests = min(
            runner.sizes.max_num_reqs, args.max_running_requests or runner.sizes.max_num_reqs
        )
        context_len = runner.model_config.context_len
        self.max_req_len = min(context_len - 1, self.max_total_tokens - 1)
        self.max_req_input_len = self.max_req_len - 5
        # resolved once: on a CPU the default reads the affinity mask and the cgroup quota
        self.chunk_size = args.chunk_size
        self.waiting_queue: list[Req] = []
        self.running_batch = ScheduleBatch([], self.kv)
        self.last_batch: ScheduleBatch | None = None
        self.chunked_req: Req | None = None
        self.ratio = NewTokenRatio.create(conservativeness=args.schedule_conservativeness)
        self.policy = SchedulePolicy(args.schedule_policy, tree_cache, args.random_seed)
        pin_cap = int(self.max_total_tokens * args.waiting_prefix_pin_fraction)
        self.pins = WaitingPins(tree_cache, pin_cap)
        self.model_worker = ModelWorker(runner)
        self.total_retractions = 0
        self.inflight: deque[InflightBatch] = deque()
        self.future_map = FutureMap(4 * (self.max_running_requests + 8), runner.device)
        self.overlap_thread = ForwardWorker(self.future_map) if args.overlap_schedule else None
        # DP attention: every step agrees token counts with the other DP ranks (collective)
        self.dp_sync = DpAttentionSync(runner.groups) if runner.groups.dp_attention else None
        # --disaggregation-mode prefill / decode: the queues around this scheduler
        self.pd: PrefillDisagg | DecodeDisagg | None = make_disagg(self, args, runner)
        # constrained requests wait here until their grammar compiled
        self.grammars = GrammarQueue(grammar_backend, runner.groups.attn_cpu)
        # --speculative-algorithm: drafts for decode steps, verified in one forward
        eagle = runner if args.speculative_algorithm == "EAGLE" else None
        drafter = None if draft_runner is None else StandaloneDrafter(draft_runner, eagle)
        self.spec = Speculator(args, self.kv, drafter) if args.speculative_algorithm else None

    @property
    def tree_cache(self) -> BasePrefixCache:
        return self.kv.tree_cache

    # ---- admission -------------------------------------------------------------------------

    def add_request(self, req: Req) -> None:
        """Validate lengths (abort with a message instead of raising), clamp max_new_tokens."""
        n = len(req.origin_input_ids)
        if n == 0:
            req.finished_reason = FinishAbort("the prompt is empty", 400)
        elif n > self.max_req_input_len:
            req.finished_reason = FinishAbort(
                f"the prompt has {n} tokens, more than this server's limit of "
                f"{self.max_req_input_len}",
                400,
            )
        limit = self.args.max_queued_requests
        if not req.finished() and limit is not None and len(self.waiting_queue) >= limit:
            req.finished_reason = FinishAbort("The request queue is full.", 503)
        if req.finished():
            return
        params = req.sampling_params
        params.max_new_tokens = min(params.max_new_tokens, self.max_req_len - n - 1)
        req.arrival_time = req.arrival_time or time.monotonic()
        if self.pd is not None and req.bootstrap is not None:
            self.pd.add(req)  # its peer first: a bootstrap (prefill) or pre-allocation queue
            return
        if self.grammars.admit(req) or req.finished():
            return  # its grammar compiles (it joins the queue later), or it cannot
        self.waiting_queue.append(req)

    def has_work(self) -> bool:
        """Requests here in any state, PD rooms included."""
        return self._has_compute() or (self.pd is not None and self.pd.pending())

    def _has_compute(self) -> bool:
        last = self.last_batch
        # Requests of the last prefill join the running batch only in the next step.
        pending_merge = (
            last is not None
            and last.forward_mode.is_extend_like()
            and any(not r.finished() for r in last.reqs)
        )
        return bool(
            self.waiting_queue
            or self.running_batch.reqs
            or self.chunked_req
            or pending_merge
            or self.grammars.waiting
        )

    def needs_step(self) -> bool:
        """Whether the loop must call step(): under DP attention every round, since another
        DP rank's batch needs this rank in its collectives."""
        return self.dp_sync is not None or self.has_work()

    def may_idle(self) -> bool:
        """Whether the loop may block waiting for input (no work here, nor on any DP rank)."""
        return not self._has_compute() and not (self.dp_sync is not None and self.dp_sync.busy)

    def idle_poll_ms(self, idle_ms: int) -> int:
        """How long the loop may block on its input: `idle_ms` when idle, a little while PD
        rooms wait on their peer (they are polled each step), nothing with work to compute."""
        if not self.may_idle():
            return 0
        return PD_POLL_MS if self.pd is not None and self.pd.pending() else idle_ms

    # ---- batch selection -------------------------------------------------------------------

    def get_next_batch_to_run(self) -> ScheduleBatch | None:
        if self.chunked_req is not None:
            self.tree_cache.cache_unfinished_req(self.chunked_req)
        last = self.last_batch
        if last is not None and last.forward_mode.is_extend_like():
            keep = [r for r in last.reqs if r is not self.chunked_req and not r.finished()]
            if keep:
                self.running_batch.merge_batch(ScheduleBatch(keep, self.kv))
        new_batch = self.get_new_batch_prefill()
        if new_batch is not None:
            return new_batch
        self.running_batch.filter_batch()
        if self.running_batch.reqs:
            return self.update_running_batch()
        return None

    def _end_aborted_chunked_req(self) -> list[Req]:
        """An abort of a request being prefilled in chunks ends it before the next batch is
        chosen: its chunks so far go to the cache (a valid prefix), the rest of its prompt is
        never computed. Returns the request it ended, if any."""
        req = self.chunked_req
        if req is None or req.to_finish is None:
            return []
        self.chunked_req = None
        req.finished_reason, req.to_finish = req.to_finish, None
        self.tree_cache.cache_finished_req(req)
        return [req]

    def get_new_batch_prefill(self) -> ScheduleBatch | None:
        if not self.waiting_queue and self.chunked_req is None:
            return None
        self._prefetch_waiting()
        running = self.running_batch.reqs
        mixed = bool(self.args.enable_mixed_chunk and self.chunk_size and running)
        budget = PrefillBudget(
            self.args.page_size,
            self.args.max_prefill_tokens,
            self.chunk_size,
            self.ratio.value,
            len(running) if mixed else 0,
        )
        adder = PrefillAdder(budget, self.tree_cache, self.kv.allocator, running)
        if self.chunked_req is not None:
            self.chunked_req.init_next_round_input()
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        matches = StepPrefixMatches(self.tree_cache)  # read-only, at most one per request
        order = self.policy.calc_priority(self.waiting_queue, matches)
        for req in order:
            if len(adder.can_run_list) + len(running) >= self.max_running_requests:
                break
            if req.storage_prefetched and not self.tree_cache.prefetch_ready(
                req.rid, prefix_match_key(req)
            ):
                continue  # its storage read may not stop yet: it waits, the others go on
            result = adder.add_one_req(req, matches.get(req))
            if adder.can_run_list and adder.can_run_list[-1] is req and not req.is_retracted:
                req.cached_tokens += len(req.prefix_indices)
            if result is not AddReqResult.CONTINUE:
                break
        if not adder.can_run_list and not running and self.pins.release_all():
            return self.get_new_batch_prefill()  # pins never stall an idle engine: retry
        admitted = set(map(id, adder.can_run_list))
        _stamp_queue_time(adder.can_run_list)
        self.waiting_queue = [r for r in self.waiting_queue if id(r) not in admitted]
        # Protect what the requests left waiting will reuse, but not at the cost of this batch.
        room = adder.cur_rem_tokens - self.args.page_size * len(adder.can_run_list)
        self.pins.refresh([r for r in order if id(r) not in admitted], matches, room)
        if not adder.can_run_list:
            return None
        if adder.new_chunked_req is not None:
            self.chunked_req = adder.new_chunked_req
        batch = ScheduleBatch(adder.can_run_list, self.kv)
        batch.prepare_for_extend()
        if mixed:
            self._mix_running_into(batch)
        return batch

    def _prefetch_waiting(self) -> None:
        """HiCache storage: read ahead what waiting requests will find in storage (once per
        request). A request leaves the queue admitted (its read taken by prefetch_ready) or
        aborted (abort_request drops its read), so no read outlives its request."""
        cache = self.tree_cache
        if not cache.prefetches:
            return
        for req in self.waiting_queue:
            if not req.storage_prefetched:
                req.storage_prefetched = True
                cache.prefetch(req.rid, prefix_match_key(req))

    def _mix_running_into(self, batch: ScheduleBatch) -> None:
        """--enable-mixed-chunk: run the decodes in the same forward as the prefill chunk."""
        running = self.running_batch
        running.filter_batch()
        if not running.reqs or not self._decode_mem_ok(running):
            return  # decode separately (retraction, if needed, happens there)
        running.prepare_for_decode()
        batch.mix_with_running(running)
        self.running_batch = ScheduleBatch([], self.kv)

    def flush_cache(self) -> bool:
        """Drop the whole prefix cache; only allowed when nothing is running or queued."""
        if self.has_work():
            return False
        if self.grammars.backend is not None:
            self.grammars.backend.reset()
        self.tree_cache.reset()
        self.kv.allocator.clear()
        self.kv.req_to_token_pool.clear()
        return True

    def update_running_batch(self) -> ScheduleBatch | None:
        batch = self.running_batch
        batch.filter_batch()
        if self.spec is not None and self.spec.prepare(batch):
            self.ratio.decay()
            return batch  # a verify; where no drafts (or their slots) came: a plain decode
        if not self._decode_mem_ok(batch):
            # A PD decode's rooms hold pages no retraction can take until their KV arrives:
            # even the last request may have to wait for them (in the waiting queue).
            keep = 0 if isinstance(self.pd, DecodeDisagg) else 1
            retracted = retract_decode(batch, self.tree_cache, self._decode_mem_ok, keep)
            self.total_retractions += len(retracted)
            self.waiting_queue.extend(retracted)
            self.ratio.after_retraction(batch.reqs)
            logger.info(
                "retract_decode count=%d new_token_ratio=%.3f", len(retracted), self.ratio.value
            )
        else:
            self.ratio.decay()
        if not batch.reqs:
            return None
        batch.prepare_for_decode()
        return batch

    def _decode_mem_ok(self, batch: ScheduleBatch) -> bool:
        ps = self.args.page_size
        need = sum(1 for r in batch.reqs if r.seqlen % ps == 1 % ps) * ps
        if self.kv.allocator.available_size() >= need:
            return True
        self.tree_cache.evict(need)
        if self.kv.allocator.available_size() < need and self.pins.release_all():
            self.tree_cache.evict(need)  # decodes go before waiting requests' prefixes
        return self.kv.allocator.available_size() >= need

    # ---- run + results ---------------------------------------------------------------------

    def step(self) -> list[Req]:
        """One scheduling round; returns requests that received a token or finished.

        Without overlap a batch is launched and processed in the same round. With overlap
        the result of batch N is processed after batch N+1 was launched, except between
        two prefills (the second should see the first's prefixes in the cache)."""
        updated: list[Req] = self.pd.poll() if self.pd is not None else []
        updated += self._admit_compiled()
        last = self.inflight[-1] if self.inflight else None
        if last is not None and self.waiting_queue and last.batch.forward_mode.is_extend_like():
            updated += self._process_oldest()
        updated += self._end_aborted_chunked_req()
        batch = self.get_next_batch_to_run()
        self.last_batch = batch
        dp_meta = self.dp_sync.exchange(batch) if self.dp_sync is not None else None
        if batch is not None:
            self.inflight.append(self._launch(batch, dp_meta))
        elif dp_meta is not None:
            self._run_idle(dp_meta)
        try:
            while self.inflight and (
                self.overlap_thread is None or len(self.inflight) > 1 or batch is None
            ):
                updated += self._process_oldest()
        finally:  # overlap: the newest batch's grammars have seen every earlier token now
            for rec in self.inflight:
                if rec.vocab_mask is not None:
                    rec.vocab_mask.fill()
        if batch is None and not self.inflight:
            self.ratio.reset()
            if self.waiting_queue:  # only storage prefetches can hold them: wait, not spin
                self.tree_cache.wait_prefetch(PREFETCH_POLL_S)
        return updated

    def _admit_compiled(self) -> list[Req]:
        """Constrained requests whose grammar is ready join the waiting queue; those whose
        grammar failed are returned, finished. An otherwise idle round waits a little."""
        idle = not (
            self.waiting_queue or self.running_batch.reqs or self.chunked_req or self.inflight
        )
        done = self.grammars.take_ready(GRAMMAR_POLL_S if idle else 0.0)
        self.waiting_queue += [r for r in done if not r.finished()]
        return [r for r in done if r.finished()]

    def _run_idle(self, dp_meta: DpAttentionMeta) -> None:
        """DP attention: no batch here but another DP rank has one; join its collectives."""
        idle = ScheduleBatch([], self.kv, forward_mode=ForwardMode.IDLE)
        runner = self.runner
        self.model_worker.forward_idle(
            idle.to_forward_batch(runner.device, runner.attn_backend, dp_meta)
        )

    def _launch(
        self, batch: ScheduleBatch, dp_meta: DpAttentionMeta | None = None
    ) -> InflightBatch:
        extend = batch.forward_mode.is_extend_like()
        samples = [not (extend and r is self.chunked_req) for r in batch.reqs]
        rec = InflightBatch(
            batch, list(batch.reqs), samples, [r.retraction_count for r in batch.reqs]
        )
        grammars = [r.grammar if s else None for r, s in zip(batch.reqs, samples, strict=True)]
        if any(g is not None for g in grammars):
            vocab = self.runner.model_config.vocab_size
            rec.vocab_mask = PendingMask(Future(), grammars, vocab)
            if self.overlap_thread is None or not self.inflight:
                rec.vocab_mask.fill()  # every earlier token is processed: fill it now
        slots = self.future_map.alloc(len(batch.reqs))
        for req, slot, sample in zip(batch.reqs, slots, samples, strict=True):
            if sample:
                req.num_inflight += 1
                req.pending_token = -slot
        work = self._generation_batch(batch, dp_meta, rec.vocab_mask)
        run = partial(self.model_worker.forward_batch_generation, work)
        input_ids = work.forward_batch.input_ids  # decode inputs: placeholders until resolved
        if self.overlap_thread is None:
            out = run(self.future_map.resolve(input_ids))
            self.future_map.store(slots, out.next_token_ids)
            rec.result.set_result(out)
        else:
            self.overlap_thread.submit(run, input_ids, slots, rec.result)
        return rec

    def _generation_batch(
        self, batch: ScheduleBatch, dp_meta: DpAttentionMeta | None, mask: PendingMask | None
    ) -> GenerationBatch:
        runner = self.runner
        rows = [r.sampling_row() for r in batch.reqs]
        nums = [r.top_logprobs_num for r in batch.reqs]
        if batch.drafts is not None:  # a verify: a row per position
            rows = _verify_rows(rows, batch.drafts)
            nums = [n for n, d in zip(nums, batch.drafts, strict=True) for _ in range(len(d) + 1)]
            assert self.spec is not None
            self.spec.on_launch()
        info = SamplingBatchInfo.build(rows, runner.model_config.vocab_size, runner.device)
        fb = batch.to_forward_batch(runner.device, runner.attn_backend, dp_meta)
        if batch.forward_mode.is_extend_like():
            wanted = input_logprobs.plan(batch.reqs, batch.prefix_lens, batch.extend_lens)
            if wanted is not None:
                fb = replace(fb, input_logprobs=wanted)
        return GenerationBatch(
            fb,
            info,
            nums if any(nums) else None,
            None if mask is None else mask.future,
            batch.drafts,
        )

    def _process_oldest(self) -> list[Req]:
        rec = self.inflight.popleft()
        out = rec.result.result()
        if isinstance(out, VerifyOutput):
            return self._process_verify(rec, out)
        ids, logprobs = out.next_token_ids.tolist(), out.logprobs.tolist()
        extend = rec.batch.forward_mode.is_extend_like()
        input_logprobs.record(rec.reqs, out.input_logprobs)
        updated: list[Req] = []
        for i, req in enumerate(rec.reqs):
            if not rec.samples[i]:
                continue  # a prefill chunk that is not the request's last samples nothing
            if req.retraction_count != rec.retractions[i]:
                continue  # retracted after launch: this token is regenerated later
            req.num_inflight -= 1
            if req.finished():
                continue  # finished at the previous step; overlap scheduled one extra token
            req.output_ids.append(ids[i])
            req.accept_grammar_token(ids[i], self.runner.model_config.vocab_size)
            if req.return_logprob:
                req.output_token_logprobs.append(logprobs[i])
                if out.top_logprobs is not None:
                    req.output_top_logprobs.append(out.top_logprobs[i])
            req.check_finished()
            if req.finished() and self._hand_over(req):
                continue  # prefill: its KV goes to the decode; it finishes on the ack
            if req.finished():
                self.tree_cache.cache_finished_req(req)
            elif extend and req not in rec.batch.decoding_reqs:
                self.tree_cache.cache_unfinished_req(req)
            updated.append(req)
        return updated

    def _process_verify(self, rec: InflightBatch, out: VerifyOutput) -> list[Req]:
        """A verify's tokens, appended one by one as decodes would have been (a request that
        finishes on one drops the rest); then its rejected KV is freed."""
        assert self.spec is not None and rec.batch.drafts is not None
        self.spec.on_verified(rec.reqs, rec.batch.drafts, out)
        updated: list[Req] = []
        for i, req in enumerate(rec.reqs):
            req.num_inflight -= 1
            if req.finished():
                continue
            if rec.batch.drafts[i]:
                req.spec_verify_ct += 1
                req.spec_accepted_drafts += len(out.tokens[i]) - 1
            for j, token in enumerate(out.tokens[i]):
                req.output_ids.append(token)
                if req.return_logprob:
                    req.output_token_logprobs.append(out.logprobs[i][j])
                    if out.top_logprobs is not None:
                        req.output_top_logprobs.append(out.top_logprobs[i][j])
                req.check_finished()
                if req.finished():
                    break
            self.spec.commit(req)
            if req.finished():
                self.tree_cache.cache_finished_req(req)
            updated.append(req)
        return updated

    def _hand_over(self, req: Req) -> bool:
        pd = self.pd
        if not isinstance(pd, PrefillDisagg) or isinstance(req.finished_reason, FinishAbort):
            return False
        return pd.on_prefilled(req)

    def close(self) -> None:
        """Stop the forward worker; drop queues and pool references."""
        if self.overlap_thread is not None:
            self.overlap_thread.stop()
            self.overlap_thread = None
        if self.pd is not None:
            self.pd.close()
            self.pd = None
        self.tree_cache.close()
        if self.grammars.backend is not None:
            self.grammars.backend.shutdown()
        self.pins.release_all()
        self.waiting_queue.clear()
        self.inflight.clear()
        self.runner.release_pools()

    def abort_request(
        self, rid: str, abort_all: bool = False, reason: FinishReason = ABORTED
    ) -> list[Req]:
        """End requests with `reason` (an abort; FinishMatchedStr when the text side found a
        stop string). Queued ones and running ones with no token in flight end at once
        (returned, already finished; a running one's KV cached as on any finish); the others
        at their next token, through the normal path."""

        def hit(req: Req) -> bool:
            return abort_all or req.rid == rid

        aborted = self.grammars.abort(hit, reason)
        aborted += [r for r in self.waiting_queue if hit(r)]
        self.waiting_queue = [r for r in self.waiting_queue if not hit(r)]
        if self.tree_cache.prefetches:  # their storage reads stop, their staged pages go
            self.tree_cache.drop_prefetches({r.rid for r in self.waiting_queue})
        for req in aborted:
            req.finished_reason = reason
            self.pins.release(req)
        running = list(self.running_batch.reqs)
        last = self.last_batch  # a prefill's requests join running_batch only next step
        if last is not None and last.forward_mode.is_extend_like():
            running += last.reqs
        if self.chunked_req is not None:
            running.append(self.chunked_req)
        for req in running:
            if not hit(req) or req.finished():
                continue
            if req.num_inflight or req is self.chunked_req:
                req.to_finish = reason
            else:  # as if it had finished on its last token: no step spent on it
                req.finished_reason = reason
                self.tree_cache.cache_finished_req(req)
                aborted.append(req)
        if self.pd is not None:  # its queues: bootstrap / pre-allocation / transfer
            aborted += self.pd.abort(None if abort_all else {rid}, reason)
        return aborted

    def num_used_tokens(self) -> int:
        free = self.kv.allocator.available_size() + self.tree_cache.evictable_size()
        return self.max_total_tokens - free

    def load(self, dp_rank: int = 0) -> LoadOutput:
        running = len(self.running_batch.reqs) + (1 if self.chunked_req else 0)
        used = self.num_used_tokens()
        queued = sum(len(r.origin_input_ids) for r in self.waiting_queue)
        return LoadOutput(
            dp_rank=dp_rank,
            num_running_reqs=running,
            num_waiting_reqs=len(self.waiting_queue),
            num_reqs=running + len(self.waiting_queue),
            num_used_tokens=used + queued,
            max_total_num_tokens=self.max_total_tokens,
            token_usage=used / self.max_total_tokens,
            hicache=hicache_load(self.tree_cache),
            experts=self.runner.expert_load(),
            spec=self.spec.load() if self.spec is not None else None,
            **(self.pd.load_fields() if self.pd is not None else {}),  # type: ignore[arg-type]
        )

    def state(self, include_pages: bool = False) -> StateOutput:
        pages = []
        if include_pages and isinstance(self.tree_cache, RadixCache):
            pages = self.tree_cache.cached_page_hashes()
        return StateOutput(
            max_total_num_tokens=self.max_total_tokens,
            available_tokens=self.kv.allocator.available_size(),
            evictable_tokens=self.tree_cache.evictable_size(),
            protected_tokens=self.tree_cache.protected_size(),
            num_running_reqs=len(self.running_batch.reqs),
            num_waiting_reqs=len(self.waiting_queue),
            page_hashes=pages,
        )

    def check_memory_invariant(self) -> None:
        """When idle: free + evictable + protected must equal the pool size (no leak)."""
        free = self.kv.allocator.available_size()
        total = free + self.tree_cache.evictable_size() + self.tree_cache.protected_size()
        if total != self.max_total_tokens:
            raise RuntimeError(f"KV leak: free {free} + cached ≠ pool {self.max_total_tokens}")


def _verify_rows(rows: list[SamplingRow], drafts: list[list[int]]) -> list[SamplingRow]:
    """Row j of a request in a verify: the request as if its first j drafts were accepted,
    so penalties and min-new-tokens see the outputs they would have seen one token at a
    time."""
    return [
        replace(row, output_ids=[*row.output_ids, *draft[:j]])
        for row, draft in zip(rows, drafts, strict=True)
        for j in range(len(draft) + 1)
    ]


def _stamp_queue_time(admitted: list[Req]) -> None:
    """Queue time ends at a request's first admission (a retracted request keeps its first)."""
    now = time.monotonic()
    for req in admitted:
        if req.queue_time is None:
            req.queue_time = now - req.arrival_time
