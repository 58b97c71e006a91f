"""The detokenizer process: token-id deltas in, text deltas out; the owner of stop strings.

Keeps one DecodeState per request (bounded LRU, so abandoned requests cannot grow it) and
forwards counts, finish reasons and logprobs to the tokenizer manager. A request whose text
completes a stop string finishes here (FinishMatchedStr): its ids, logprobs and completion
count are cut at the id that completed it, the tokenizer manager tells the scheduler to stop
it, and what the scheduler still sends for it (generated before it heard) is dropped.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, TypeVar

import zmq

from radixserve.engine.detokenizer.incremental_detokenizer import (
    DecodeState,
    IncrementalDetokenizer,
    TextStep,
)
from radixserve.engine.ipc.channels import PortArgs, PullChannel, PushChannel
from radixserve.engine.ipc.messages import (
    BatchStrOutput,
    BatchTokenIDOutput,
    DetokenizerInput,
)

logger = logging.getLogger(__name__)

MAX_STATES = 65536

T = TypeVar("T")


def _at(column: list[T], i: int, default: T) -> T:
    """Row i of an optional column (an empty list: the sender left the column out)."""
    return column[i] if column else default


class DetokenizerManager:
    def __init__(self, tokenizer: Any) -> None:
        self.detok = IncrementalDetokenizer.for_tokenizer(tokenizer)
        self.states: OrderedDict[str, DecodeState] = OrderedDict()
        # Ended here on a stop string while the scheduler still ran them: their outputs are
        # dropped until the scheduler's own finish for them arrives (its last output).
        self.stopped: OrderedDict[str, None] = OrderedDict()

    def _state(self, out: BatchTokenIDOutput, i: int) -> DecodeState:
        rid = out.rids[i]
        st = self.states.get(rid)
        if st is None:
            st = self.detok.start(out.prompt_tail[i], out.detokenize[i])
            _put(self.states, rid, st)
        else:
            self.states.move_to_end(rid)
        return st

    def _dropped(self, rid: str, out: BatchTokenIDOutput, i: int) -> bool:
        if rid not in self.stopped:
            return False
        if out.finished_reasons[i] is not None:
            del self.stopped[rid]
        return True

    def handle(self, out: BatchTokenIDOutput) -> BatchStrOutput | None:
        """Text for a batch of id deltas; None when every request in it had ended here."""
        rows: list[tuple[int, TextStep]] = []
        for i, rid in enumerate(out.rids):
            if self._dropped(rid, out, i):
                continue
            finish = out.finished_reasons[i]
            step = self.detok.step(self._state(out, i), out.new_output_ids[i], finish)
            if step.finish is not None:
                self.states.pop(rid, None)
                if finish is None:  # ended here: the scheduler still runs it
                    _put(self.stopped, rid, None)
            rows.append((i, step))
        return _str_output(out, rows) if rows else None


def _put(lru: OrderedDict[str, T], rid: str, value: T) -> None:
    lru[rid] = value
    while len(lru) > MAX_STATES:
        lru.popitem(last=False)


def _str_output(out: BatchTokenIDOutput, rows: list[tuple[int, TextStep]]) -> BatchStrOutput:
    """The text side's batch: each row's ids, logprobs and completion count cut to the ids
    its step kept."""
    cols: dict[str, list[Any]] = {name: [] for name in BatchStrOutput.__struct_fields__}
    for i, step in rows:
        n = step.num_ids
        cols["rids"].append(out.rids[i])
        cols["text_deltas"].append(step.delta)
        cols["new_output_ids"].append(out.new_output_ids[i][:n])
        cols["finished_reasons"].append(step.finish)
        cols["prompt_tokens"].append(out.prompt_tokens[i])
        cols["completion_tokens"].append(
            out.completion_tokens[i] - (len(out.new_output_ids[i]) - n)
        )
        cols["cached_tokens"].append(out.cached_tokens[i])
        cols["retractions"].append(out.retractions[i])
        cols["output_token_logprobs"].append(_at(out.output_token_logprobs, i, [])[:n])
        cols["output_top_logprobs"].append(_at(out.output_top_logprobs, i, [])[:n])
        cols["input_logprobs"].append(_at(out.input_logprobs, i, None))
        cols["queue_times"].append(_at(out.queue_times, i, None))
        cols["spec_verify_ct"].append(_at(out.spec_verify_ct, i, 0))
        cols["spec_accepted_drafts"].append(_at(out.spec_accepted_drafts, i, 0))
    return BatchStrOutput(**cols)


def run_detokenizer_process(model_path: str, ports: PortArgs, revision: str | None = None) -> None:
    # Imported here, in the child: the loader pulls in transformers.
    from radixserve.engine.model_loader import resolve_model
    from radixserve.engine.model_loader.loader import load_tokenizer

    manager = DetokenizerManager(load_tokenizer(resolve_model(model_path, revision)))
    ctx = zmq.Context()
    recv = PullChannel(ctx, ports.detokenizer_input, bind=True, msg_type=DetokenizerInput)
    send = PushChannel(ctx, ports.tokenizer_input, bind=False)
    while True:  # until the parent terminates this process
        msg = recv.recv()  # blocking: never None
        if isinstance(msg, BatchTokenIDOutput) and (text := manager.handle(msg)) is not None:
            send.send(text)
