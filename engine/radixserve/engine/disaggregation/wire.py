"""The control plane of a prefill/decode pair: what each side tells the other, as tagged msgspec
structs (msgpack over ZMQ PUSH/PULL), and the topology the bootstrap handshake compares.

A room (`bootstrap_room`, chosen by the router) names one request on both sides. The decode
side opens it (`KVRequest`: where to write and what it already has); the prefill side closes it
(`KVDone` with the first token, or `KVFailed`); the decode side acknowledges a `KVDone` with
`KVAck`, and only then does the prefill release the request's KV to its radix cache. A decode
that gives up on a room sends `KVAbort` and keeps its destination pages until `KVDrained` (or
any final word) says no write can reach them any more.
"""

from __future__ import annotations

import msgspec

# SGLang's: requests whose bootstrap_host is this have no peer (warm-up, health checks) and run
# co-located on whichever server receives them.
FAKE_BOOTSTRAP_HOST = "2.2.2.2"


class Topology(msgspec.Struct, frozen=True):
    """What a pair must agree on for one side's KV pages to be the other's. The TP sizes may
    differ: each side's ranks say which KV heads they hold (`RankKV.heads`), and the prefill's
    ranks re-slice the heads into the decode's (`tp_size` is reported, not compared)."""

    architecture: str
    num_layers: int
    num_kv_heads: int  # the heads of the KV pool's rows, all ranks together (MLA: 1 latent)
    head_dim: int  # the width of one head's row in the pool
    vocab_size: int
    kv_dtype: str
    page_size: int
    tp_size: int


def topology_mismatch(
    prefill: Topology, decode: Topology, prefill_addr: str, decode_addr: str
) -> str | None:
    """None when the pair works, else an error that names both sides and their values."""
    model = ("architecture", "num_layers", "num_kv_heads", "head_dim", "vocab_size")
    for name in (*model, "kv_dtype", "page_size"):
        p, d = getattr(prefill, name), getattr(decode, name)
        if p != d:
            what = "model" if name in model else name
            return (
                f"prefill/decode topology mismatch ({what}): prefill {prefill_addr} has "
                f"{name}={p}, decode {decode_addr} has {name}={d}"
            )
    return None


class KVHeads(msgspec.Struct, frozen=True):
    """The KV heads one rank's pool rows hold: [first, first + count) of the topology's."""

    first: int
    count: int

    def __contains__(self, head: int) -> bool:
        return self.first <= head < self.first + self.count


class RankKV(msgspec.Struct, frozen=True):
    """One TP rank's KV buffers as its peers see them: its transfer-engine session, the heads
    it holds, per layer the base address of its K and V buffers, and one token's row length in
    bytes (per layer, K or V)."""

    session: str
    heads: KVHeads
    k_ptrs: list[int]
    v_ptrs: list[int]
    item_len: int


class RankInfo(msgspec.Struct, frozen=True):
    """A prefill's control endpoint (its rank 0's KV manager's ZMQ PULL socket: rank 0 speaks
    for its TP peers)."""

    tp_rank: int
    endpoint: str  # tcp://host:port


class PrefillInfo(msgspec.Struct, frozen=True):
    """GET /route on a prefill's bootstrap server, once its control rank registered.
    `session`: new each time the server starts (GET /health says it too), so a decode notices a
    prefill that restarted at the same address with new control endpoints."""

    topology: Topology
    ranks: list[RankInfo]
    session: str = ""


class _Msg(msgspec.Struct, frozen=True, tag=True):
    pass


class KVRequest(_Msg, frozen=True):
    """Decode → prefill: write the prompt's KV from `decode_prefix_len` on into `dst_pages` of
    every decode rank (TP ranks allocate in lock-step: the page ids are the same on each)."""

    room: int
    decode_endpoint: str  # where the prefill answers (the decode's rank-0 PULL socket)
    topology: Topology  # the decode's; the prefill checks it too
    decode_prefix_len: int  # tokens the decode already holds (page-aligned)
    dst_pages: list[int]  # decode page ids for positions decode_prefix_len … prompt end
    dst_ranks: list[RankKV]  # the decode's TP ranks, rank order


class KVRefuse(_Msg, frozen=True):
    """Decode → prefill: the decode refused the pair at bootstrap (topology mismatch)."""

    room: int
    reason: str


class KVAbort(_Msg, frozen=True):
    """Decode → prefill: the decode gave up on the room; answer with KVDrained once no write of
    it can still land."""

    room: int
    decode_endpoint: str


class KVAck(_Msg, frozen=True):
    """Decode → prefill: the KV and first token arrived; the prefill may release its copy."""

    room: int


class KVDone(_Msg, frozen=True):
    """Prefill → decode: every page is written; the request's first token, its counts, and
    the prompt's log-probabilities where the request asked for them."""

    room: int
    first_token: int
    logprob: float
    top_logprobs: list[tuple[float, int]]
    cached_tokens: int  # prompt tokens the prefill found in its radix cache
    num_pages: int
    num_bytes: int
    # the prompt's log-probabilities (logprob_start_len ≥ 0): only the prefill computes them
    input_token_logprobs: list[float | None] = []
    input_top_logprobs: list[list[tuple[float, int]]] = []


class KVFailed(_Msg, frozen=True):
    """Prefill → decode: the room failed (no more writes will come)."""

    room: int
    reason: str


class KVDrained(_Msg, frozen=True):
    """Prefill → decode: answer to KVAbort; no write for the room is in flight."""

    room: int


ToPrefill = KVRequest | KVRefuse | KVAbort | KVAck
ToDecode = KVDone | KVFailed | KVDrained
