"""Overlap of CPU scheduling with the model forward (SGLang's overlap event loop, on CPU).

A ForwardWorker thread runs forward + sampling for batches in submission order while the
scheduler thread builds the next batch and processes the previous result. The next decode
batch is built before the current one's tokens are known, so its inputs hold placeholders
(−slot); the worker resolves them from the FutureMap just before the forward and writes
the sampled ids back afterwards. Serial execution in the worker makes this race-free:
batch N has always finished when batch N+1 resolves its placeholders.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from radixserve.engine.sampling import SampleOutput
from radixserve.engine.scheduler.grammar_queue import PendingMask
from radixserve.engine.scheduler.req import Req
from radixserve.engine.scheduler.schedule_batch import ScheduleBatch
from radixserve.engine.speculative import VerifyOutput

StepOutput = SampleOutput | VerifyOutput  # one token per request, or a verify's accepted run
ForwardFn = Callable[[torch.Tensor], StepOutput]  # resolved input ids → sampled output
STOP_TIMEOUT_S = 60.0  # longer than any forward; a stuck one is logged, not waited on forever

logger = logging.getLogger(__name__)


class FutureMap:
    """A ring of token ids; slot k is referred to as the placeholder id −k (k ≥ 1).

    The ring lives on the runner's device: it is indexed with the batch's device input ids
    and filled with the sampler's device output, so no step copies ids to the host.
    """

    def __init__(self, size: int, device: torch.device) -> None:
        self.size = size
        self.device = device
        self.buf = torch.zeros(size + 1, dtype=torch.int64, device=device)  # [size + 1] int64
        self._next = 1

    def alloc(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            out.append(self._next)
            self._next = self._next % self.size + 1
        return out

    def resolve(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: [T] int64 on the device; placeholders replaced by their stored ids."""
        mask = input_ids < 0
        if bool(mask.any()):
            input_ids = input_ids.clone()
            input_ids[mask] = self.buf[-input_ids[mask]]
        return input_ids

    def store(self, slots: list[int], token_ids: torch.Tensor) -> None:
        """token_ids: [len(slots)] int64 on the device, written to the ring at `slots`."""
        index = torch.tensor(slots, dtype=torch.int64, device=self.device)
        self.buf[index] = token_ids.to(self.device)


@dataclass(slots=True)
class InflightBatch:
    """A launched batch: its requests as they were at launch and where its result lands."""

    batch: ScheduleBatch
    reqs: list[Req]
    samples: list[bool]  # False: a chunk that is not the request's last (no token)
    retractions: list[int]  # retraction counts at launch: a retracted request's token is void
    result: Future[StepOutput] = field(default_factory=Future)
    vocab_mask: PendingMask | None = None  # constrained rows: the bitmask the sampler awaits


class ForwardWorker:
    """Runs submitted forwards one at a time on a daemon thread."""

    def __init__(self, future_map: FutureMap) -> None:
        self.future_map = future_map
        self._queue: queue.Queue[
            tuple[ForwardFn, torch.Tensor, list[int], Future[StepOutput]] | None
        ] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="forward-worker", daemon=True)
        self._thread.start()

    def submit(
        self, fn: ForwardFn, input_ids: torch.Tensor, slots: list[int], fut: Future[StepOutput]
    ) -> None:
        self._queue.put((fn, input_ids, slots, fut))

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, input_ids, slots, fut = item
            try:
                out = fn(self.future_map.resolve(input_ids))
                self.future_map.store(slots, out.next_token_ids)
                fut.set_result(out)
            except BaseException as exc:  # surfaced to the scheduler thread by fut.result()
                fut.set_exception(exc)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Let the queued forwards finish, then end the thread. Waiting matters: a forward
        still running when the pools are dropped or the interpreter exits would use freed
        buffers, or re-take the GIL from inside a C++ call during finalization, which aborts
        the process ("terminate called without an active exception")."""
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("forward worker still running %.0f s after stop", timeout)
