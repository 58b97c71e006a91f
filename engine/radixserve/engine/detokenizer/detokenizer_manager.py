"""The detokenizer process: token-id deltas in, text deltas out (stop strings trimmed).

Keeps one DecodeState per request (bounded LRU, so abandoned requests cannot grow it) and
forwards counts, finish reasons and logprobs unchanged to the tokenizer manager.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import zmq

from radixserve.engine.detokenizer.incremental_detokenizer import (
    DecodeState,
    IncrementalDetokenizer,
)
from radixserve.engine.ipc.channels import PortArgs, PullChannel, PushChannel
from radixserve.engine.ipc.messages import (
    BatchStrOutput,
    BatchTokenIDOutput,
    DetokenizerInput,
)

logger = logging.getLogger(__name__)

MAX_STATES = 65536


class DetokenizerManager:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.detok = IncrementalDetokenizer(self._decode)
        self.states: OrderedDict[str, DecodeState] = OrderedDict()

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def _state(self, out: BatchTokenIDOutput, i: int) -> DecodeState:
        rid = out.rids[i]
        st = self.states.get(rid)
        if st is None:
            st = DecodeState(
                out.skip_special_tokens[i], tuple(out.stop_strs[i]), out.no_stop_trim[i]
            )
            IncrementalDetokenizer.start(out.prompt_tail[i], st)
            self.states[rid] = st
            while len(self.states) > MAX_STATES:
                self.states.popitem(last=False)
        else:
            self.states.move_to_end(rid)
        return st

    def handle(self, out: BatchTokenIDOutput) -> BatchStrOutput:
        deltas = []
        for i, rid in enumerate(out.rids):
            finish = out.finished_reasons[i]
            deltas.append(self.detok.step(self._state(out, i), out.new_output_ids[i], finish))
            if finish is not None:
                self.states.pop(rid, None)
        return BatchStrOutput(
            rids=out.rids,
            text_deltas=deltas,
            new_output_ids=out.new_output_ids,
            finished_reasons=out.finished_reasons,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.completion_tokens,
            cached_tokens=out.cached_tokens,
            retractions=out.retractions,
            output_token_logprobs=out.output_token_logprobs,
            output_top_logprobs=out.output_top_logprobs,
            queue_times=out.queue_times,
        )


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
        if isinstance(msg, BatchTokenIDOutput):
            send.send(manager.handle(msg))
