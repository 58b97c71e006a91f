"""ForwardBatch and ForwardMode: what one forward reads, below every package that reads it.

Attention, layers and models read the batch at run time, the model executor and the scheduler
build it; it imports only `mem_cache` (the pools it carries) and names the attention backend
and layer by Protocols.
"""

from radixserve.engine.forward_batch.dp_attention_meta import DpAttentionMeta
from radixserve.engine.forward_batch.forward_batch_info import (
    AttentionForward,
    AttentionLayer,
    ForwardBatch,
    ForwardMode,
    InputLogprobRows,
)

__all__ = [
    "AttentionForward",
    "AttentionLayer",
    "DpAttentionMeta",
    "ForwardBatch",
    "ForwardMode",
    "InputLogprobRows",
]
