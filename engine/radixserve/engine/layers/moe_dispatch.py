"""Expert parallelism: how one MoE layer's tokens reach the EP ranks holding their experts.

The EP group's ranks each hold a contiguous `ExpertRange` (`ExpertRange.for_rank`). The hidden
states entering the layer are the same on every rank of the group (tensor parallelism
replicates them). Two dispatch modes, as SGLang's `--moe-a2a-backend` (their names:
`configs.server_args.A2A_BACKENDS`):

- `none`: every rank runs its local experts on all tokens (choices of other ranks' experts add
  nothing), then a float32 all-reduce over the group sums the shares.
- `all_to_all`: rank r takes its contiguous slice of the tokens, sends each (token, choice) row
  only to the rank owning that expert (`all_to_all_single`: counts first, then rows and expert
  ids), runs the rows it received through its experts, sends the results back the same way,
  combines them weighted by the router, and an all-reduce of the slices rebuilds every token.

Both give the sum of the same per-expert outputs in expert order, so they agree with each
other and with one process. Runs in the scheduler process, inside the model's forward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixserve.engine.distributed import GroupHandle

if TYPE_CHECKING:
    from radixserve.engine.layers.moe import FusedMoE, TopKOutput


def ep_moe_forward(
    experts: FusedMoE,
    hidden: torch.Tensor,
    topk: TopKOutput,
    ep: GroupHandle,
    backend: str = "none",
) -> torch.Tensor:
    """hidden [T, H] (same on every EP rank) → the routed experts' weighted sum [T, H]."""
    if ep.size == 1:
        return experts(hidden, topk)
    if backend == "all_to_all":
        out = _all_to_all(experts, hidden, topk, ep)
    else:
        out = experts.forward_f32(hidden, topk)
    return ep.all_reduce(out).to(hidden.dtype)


def _token_slice(num_tokens: int, ep: GroupHandle) -> slice:
    """This rank's share of the tokens it dispatches: contiguous, sizes differing by ≤ 1."""
    return slice(ep.rank * num_tokens // ep.size, (ep.rank + 1) * num_tokens // ep.size)


def _all_to_all(
    experts: FusedMoE, hidden: torch.Tensor, topk: TopKOutput, ep: GroupHandle
) -> torch.Tensor:
    """float32 [T, H]: this rank's token slice combined, zero elsewhere (the caller sums)."""
    mine = _token_slice(hidden.shape[0], ep)
    ids, weights = topk.ids[mine], topk.weights[mine]
    top_k = ids.shape[1]
    flat_ids = ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)  # by expert, hence by owning rank
    per_rank = experts.num_experts // ep.size
    send = torch.bincount(flat_ids // per_rank, minlength=ep.size)
    recv = ep.all_to_all(send, [1] * ep.size, [1] * ep.size)
    send_counts, recv_counts = send.tolist(), recv.tolist()
    tokens = order // top_k
    rows = ep.all_to_all(hidden[mine][tokens], send_counts, recv_counts)
    row_experts = ep.all_to_all(flat_ids[order], send_counts, recv_counts)
    done = ep.all_to_all(experts.forward_rows(rows, row_experts), recv_counts, send_counts)
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    scaled = done.float() * weights.reshape(-1)[order, None]
    out[mine].index_add_(0, tokens, scaled)
    return out
