"""Builds a scheduler's prefill or decode side (`--disaggregation-mode`) from its runner: the
transfer backend, the registered KV buffers, the control sockets, and on a prefill the
bootstrap server, registered with this rank."""

from __future__ import annotations

from typing import TYPE_CHECKING

import zmq

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.disaggregation.bootstrap import BootstrapServer, Registration
from radixserve.engine.disaggregation.kv_manager import KVLayout, KVManager
from radixserve.engine.disaggregation.transfer import make_backend
from radixserve.engine.disaggregation.wire import RankInfo, Topology
from radixserve.engine.model_executor.model_runner import ModelRunner
from radixserve.engine.scheduler.disagg_common import DisaggConfig, advertised_host
from radixserve.engine.scheduler.disagg_decode import DecodeDisagg
from radixserve.engine.scheduler.disagg_prefill import PrefillDisagg

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
    )


def topology(args: ServerArgs, runner: ModelRunner) -> Topology:
    c = runner.model_config
    dtype = str(runner.token_to_kv_pool.dtype).removeprefix("torch.")
    return Topology(
        c.architecture, c.num_hidden_layers, c.num_key_value_heads, c.head_dim, c.vocab_size,
        dtype, args.page_size, args.tp_size,
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
        args.disaggregation_transfer_backend, host, args.disaggregation_ib_device
    )
    kv = KVManager(backend, kv_layout(runner, args.page_size), host, zmq.Context())
    topo = topology(args, runner)
    if mode == "decode":
        return DecodeDisagg(scheduler, kv, topo, config)
    port = args.disaggregation_bootstrap_port
    try:
        server = BootstrapServer(args.host, port, args.tp_size)
    except OSError as exc:
        kv.close()
        raise ValueError(f"disaggregation_bootstrap_port: cannot bind {port}: {exc}") from None
    server.register(Registration(RankInfo(0, kv.endpoint), topo))
    return PrefillDisagg(scheduler, kv, topo, f"{host}:{port}", config, server)
