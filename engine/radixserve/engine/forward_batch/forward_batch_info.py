"""ForwardBatch: the tensor view of one scheduled batch, consumed by the model and attention.

The scheduler's ScheduleBatch is CPU bookkeeping (Req objects); ForwardBatch holds only what a
forward needs, already on the model's device. Every batch is described as a list of extends:
request i computes positions [extend_prefix_lens[i], seq_lens[i]); a decode is an extend of one.

It sits below attention, layers and models, which all read it, so what it carries from above
is named by a Protocol: `AttentionForward` (the backend, `attention.AttentionBackend`) and the
`AttentionLayer` that backend computes for (`layers.radix_attention.RadixAttention`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import Protocol

import torch

from radixserve.engine.forward_batch.dp_attention_meta import DpAttentionMeta
from radixserve.engine.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool


class ForwardMode(Enum):
    EXTEND = auto()  # prefill (possibly with a cached prefix, possibly a chunk)
    DECODE = auto()  # one new token per request
    MIXED = auto()  # a prefill chunk plus running decodes in one forward
    IDLE = auto()  # nothing to compute on this rank (DP attention keeps ranks in step)
    # speculative decoding: each request's last token and its drafts as one extend, logits
    # at every position (attention sees it as an extend; the scheduler as a decode step)
    TARGET_VERIFY = auto()

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE

    def is_extend_like(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED)

    def is_idle(self) -> bool:
        return self is ForwardMode.IDLE

    def is_target_verify(self) -> bool:
        return self is ForwardMode.TARGET_VERIFY


class AttentionLayer(Protocol):
    """What an attention backend reads from the layer it computes for: this rank's heads."""

    @property
    def layer_id(self) -> int: ...  # its K/V buffers in the pool
    @property
    def num_heads(self) -> int: ...  # query heads on this rank
    @property
    def num_kv_heads(self) -> int: ...  # KV heads on this rank
    @property
    def head_dim(self) -> int: ...  # of q and k
    @property
    def v_head_dim(self) -> int: ...  # of v and the output (MLA: narrower than head_dim)
    @property
    def scaling(self) -> float: ...  # softmax scale of q·k


class AttentionForward(Protocol):
    """The attention backend as a batch carries it: the one call a layer makes through it."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayer,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor: ...


@dataclass(frozen=True, slots=True)
class InputLogprobRows:
    """Prompt log-probabilities one forward computes (SGLang's `logprob_start_len`): the new
    tokens whose next token is a prompt token, and those tokens. Every attention-TP rank is
    given the same rows (the LM head gathers across them)."""

    rows: torch.Tensor  # [R] int64, indices into the batch's new tokens
    targets: torch.Tensor  # [R] int64, the prompt token that follows each row
    counts: list[int]  # [B] rows of each request, in batch order (their rows are contiguous)
    top_k: int  # the most top log-probabilities a request asks for (0: none)


# Frozen: built once per batch by the scheduler, then only read (the overlap thread runs the
# forward while the scheduler builds the next batch; a copy carries resolved input ids).
@dataclass(frozen=True, slots=True)
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    req_pool_indices: torch.Tensor  # [B] int64, rows of req_to_token
    seq_lens: torch.Tensor  # [B] int64, lengths after this forward
    out_cache_loc: torch.Tensor  # [T] int64, KV slots the new tokens are written to
    extend_prefix_lens_cpu: list[int]  # [B]
    extend_seq_lens_cpu: list[int]  # [B], new tokens per request (1 for decodes)
    seq_lens_cpu: list[int]  # [B]
    req_to_token_pool: ReqToTokenPool  # the live rows (kernels index them by req_pool_indices)
    token_to_kv_pool: MHATokenToKVPool
    attn_backend: AttentionForward
    # [B, max(seq_lens)] int64: a copy of each request's req_to_token row taken when the
    # batch was built, so the CPU may rewrite rows for the next batch during this forward.
    kv_rows: torch.Tensor
    # DP attention: every DP rank's token count this step (None without DP attention)
    dp_meta: DpAttentionMeta | None = None
    # [B]: whether request i's extend reaches the end of its tokens, so its last token is
    # sampled (False for a chunk of a longer prompt); None: all do
    extend_completes_cpu: list[bool] | None = None
    # EAGLE drafts: [T, hidden] the target's hidden state paired with each input token (the
    # draft head's second input); None elsewhere
    spec_hidden: torch.Tensor | None = None
    # prompt log-probabilities to compute beside the next-token logits (None: no request asks)
    input_logprobs: InputLogprobRows | None = None

    def req_kv_rows(self, max_len: int) -> torch.Tensor:
        """[B, max_len] int64 KV slots of each request's positions (beyond seq_len: junk)."""
        return self.kv_rows[:, :max_len]
