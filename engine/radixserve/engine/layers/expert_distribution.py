"""The expert distribution recorder (`--expert-distribution-recorder-mode stat`, SGLang's name):
how many tokens each MoE layer routed to each expert, per forward pass, while recording.

Every `SparseMoeBlock` of the model holds the recorder and reports its top-k expert ids per
forward (`on_select`); the model runner closes each pass (`end_pass`), which keeps that pass's
counts `[layers, experts]` in a ring of `buffer_size` passes (-1: unbounded). The control
endpoints (`/start_expert_distribution_record`, `/stop_…`, `/dump_…`) start (after a reset),
stop, and dump (then reset). Layers without experts (DeepSeek's first dense layers) count zero,
so the dump's shape is `[passes, num_hidden_layers, num_experts]`, as SGLang's `logical_count`.
Beside it the recorder counts the physical slots the choices were dispatched to (EPLB's
replicas, layers/expert_location.py): `[passes, layers, slots]`, whose per-rank sums are the EP
ranks' loads.

The ids are the router's (logical) experts: every rank of a TP or EP group routes the same
tokens, and under DP attention the MoE runs over every DP rank's tokens, so any rank's counts
are the whole model's. The forward may run on the overlap thread while a control request
arrives on the scheduler thread: a lock guards the state. Not recorded: forwards replayed from
a CUDA graph (their Python does not run).
"""

from __future__ import annotations

import threading
from collections import deque

import torch

RECORDER_MODES = ("stat",)


class ExpertDistributionRecorder:
    def __init__(
        self,
        num_layers: int,
        num_experts: int,
        buffer_size: int = 1000,
        num_physical: int | None = None,
    ) -> None:
        self.num_layers = num_layers
        self.num_experts = num_experts
        self.num_physical = num_physical or num_experts
        self.buffer_size = buffer_size
        self.recording = False
        self._lock = threading.Lock()
        # one pass's counts: the logical experts [:, :E], then the physical slots [:, E:]
        self._pass = torch.zeros(num_layers, num_experts + self.num_physical, dtype=torch.int64)
        self._seen = False  # a MoE layer reported in the current pass
        maxlen = None if buffer_size < 0 else buffer_size
        self._passes: deque[torch.Tensor] = deque(maxlen=maxlen)
        # the kept passes' sum, kept as passes come and go: /metrics reads it on every scrape
        # (on the scheduler's thread), which must not add up a thousand passes each time
        self._total = torch.zeros_like(self._pass)

    def start(self) -> None:
        with self._lock:
            self._reset()
            self.recording = True

    def stop(self) -> None:
        with self._lock:
            self.recording = False

    def on_select(
        self, layer_id: int, topk_ids: torch.Tensor, slots: torch.Tensor | None = None
    ) -> None:
        """One MoE layer's choices this pass (ids [T, top_k], logical expert ids) and the
        physical slots they went to (the same ids without EPLB's placement)."""
        if not self.recording or topk_ids.numel() == 0:
            return
        e, p = self.num_experts, self.num_physical
        logical = torch.bincount(topk_ids.flatten().to("cpu"), minlength=e)[:e]
        physical = (
            logical if slots is None else torch.bincount(slots.flatten().to("cpu"), minlength=p)[:p]
        )
        with self._lock:
            self._pass[layer_id, :e] += logical
            self._pass[layer_id, e:] += physical
            self._seen = True

    def end_pass(self) -> None:
        """The forward is over: keep its counts (a pass no MoE layer saw is not kept)."""
        with self._lock:
            if self.recording and self._seen:
                if len(self._passes) == self._passes.maxlen:
                    self._total -= self._passes[0]  # the ring drops its oldest on append
                self._passes.append(self._pass.clone())
                self._total += self._pass
            self._pass.zero_()
            self._seen = False

    def window(self) -> tuple[int, torch.Tensor]:
        """(kept passes, their physical slots' counts summed [layers, slots]), no reset."""
        with self._lock:
            return len(self._passes), self._total[:, self.num_experts :].clone()

    def dump(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept passes' counts, logical [passes, layers, experts] and physical [passes,
        layers, slots], then a reset."""
        with self._lock:
            width = self.num_experts + self.num_physical
            out = (
                torch.stack(list(self._passes))
                if self._passes
                else torch.zeros(0, self.num_layers, width, dtype=torch.int64)
            )
            self._reset()
        return out[..., : self.num_experts], out[..., self.num_experts :]

    def _reset(self) -> None:
        self._passes.clear()
        self._total.zero_()
        self._pass.zero_()
        self._seen = False
