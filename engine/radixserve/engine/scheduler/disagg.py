"""Builds a scheduler's prefill or decode side (`--disaggregation-mode`) from its runner: the
transfer backend, the registered KV buffers, the control sockets (TP rank 0), every TP rank's
buffers and heads (gathered once), and on a prefill's rank 0 the bootstrap server."""

from __future__ import annotations

from typing import TYPE_CHECKING

import zmq

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.disaggregation.bootstrap import BootstrapServer, Registration
from radixserve.engine.disaggregation.kv_manager import KVLayout, KVManager
from radixserve.engine.disaggregation.transfer import make_backend
from radixserve.engine.disaggregation.wire import KVHeads, RankInfo, Topology
from radixserve.engine.layers.parallel_linear import kv_head_layout
from radixserve.engine.mem_cache.memory_pool import MLATokenToKVPool
from radixserve.engine.model_executor.model_runner import ModelRunner
from radixserve.engine.scheduler.disagg_common import DisaggConfig, advertised_host
from radixserve.engine.scheduler.disagg_decode import DecodeDisagg
from radixserve.engine.scheduler.disagg_prefill import PrefillDisagg
from radixserve.engine.scheduler.disagg_sync import RoundSync

if TYPE_CHECKING:
    from radixserve.engine.scheduler.scheduler import Scheduler


def kv_layout(runner: ModelRunner, page_size: int) -> KVLayout:
    pool = runner.token_to_kv_pool
    k, v = pool.k_buffer, pool.v_buffer
    item_len = k[0][0].numel() * k[0].element_size()
    return KVLayout(
        tuple(t.data_ptr() for t in k),
        tuple(t.data_ptr() for t in v),
        item_len,
        page_size,
        k[0].numel() * k[0].element_size(),
        _heads(runner),
    )


def _heads(runner: ModelRunner) -> KVHeads:
    """The KV heads this rank's pool rows hold. MLA's one latent row is on every rank."""
    if isinstance(runner.token_to_kv_pool, MLATokenToKVPool):
        return KVHeads(0, 1)
    c = runner.model_config
    layout = kv_head_layout(c.num_key_value_heads, runner.groups.attn_tp)
    return KVHeads(layout.first_head, layout.num_local_heads)


def topology(args: ServerArgs, runner: ModelRunner) -> Topology:
    c = runner.model_config
    pool = runner.token_to_kv_pool
    dtype = str(pool.dtype).removeprefix("torch.")
    mla = isinstance(pool, MLATokenToKVPool)
    num_heads = 1 if mla else c.num_key_value_heads
    return Topology(
        c.architecture, c.num_hidden_layers, num_heads, pool.k_buffer[0].shape[-1],
        c.vocab_size, dtype, args.page_size, args.tp_size,
    )  # fmt: skip


def make_disagg(
    scheduler: Scheduler, args: ServerArgs, runner: ModelRunner
) -> PrefillDisagg | DecodeDisagg | None:
    mode = args.disaggregation_mode
    if mode == "null":
        return None
    config = DisaggConfig.from_env()
    host = advertised_host(args.host)
    backend = make_backend(
        args.disaggregation_transfer_backend, host, args.disaggregation_ib_device, args.device
    )
    layout = kv_layout(runner, args.page_size)
    sync = RoundSync(runner.groups.attn_cpu, layout.rank_kv(backend.session_id))
    kv = KVManager(backend, layout, host, zmq.Context(), control=sync.lead)
    topo = topology(args, runner)
    if mode == "decode":
        return DecodeDisagg(scheduler, kv, topo, config, sync)
    port = args.disaggregation_bootstrap_port
    address = f"{host}:{port}"
    if not sync.lead:
        return PrefillDisagg(scheduler, kv, topo, address, config, sync)
    try:
        server = BootstrapServer(args.host, port)
    except OSError as exc:
        kv.close()
        raise ValueError(f"disaggregation_bootstrap_port: cannot bind {port}: {exc}") from None
    server.register(Registration(RankInfo(0, kv.endpoint), topo))
    return PrefillDisagg(scheduler, kv, topo, address, config, sync, server)
