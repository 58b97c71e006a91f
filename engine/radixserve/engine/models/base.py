"""CausalLM: what the ModelRunner needs of every model architecture (runs in the scheduler
process, on the runner's device). Architectures subclass it, one file each, listed in
`registry`. Of the ForwardBatch they read only the forward mode (an IDLE rank skips attention)
and the DP-attention metadata; attention and the logits processor read the rest."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

import torch
from torch import nn

from radixserve.engine.forward_batch import ForwardBatch
from radixserve.engine.layers.logits_processor import LogitsProcessorOutput
from radixserve.engine.model_loader.weight import Weight


class CausalLM(nn.Module, ABC):
    @abstractmethod
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> LogitsProcessorOutput:
        """input_ids, positions: [T] int64 (all new tokens of the batch) → next-token logits."""

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, Weight]]) -> None:
        """Copy checkpoint tensors (HF names) into the parameters; fail on any left unset.

        Under tensor parallelism the weights are LazyWeights: copy only this rank's slice."""
