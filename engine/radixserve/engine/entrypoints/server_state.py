"""ServerState: everything the HTTP routes need, held on `app.state` (no module globals)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.entrypoints.launch import ChildProcesses
from radixserve.engine.entrypoints.request_builder import ServerLimits
from radixserve.engine.scheduler.kv_event_publisher import port_for_rank
from radixserve.engine.tokenizer.metrics import EngineMetrics
from radixserve.engine.tokenizer.tokenizer_manager import TokenizerManager


@dataclass(slots=True)
class ServerState:
    args: ServerArgs
    tokenizer: Any
    tokenizer_manager: TokenizerManager
    children: ChildProcesses
    metrics: EngineMetrics
    model_info: dict[str, Any]
    limits: ServerLimits
    # --reasoning-parser: the chat template thinks unless told not to (reasoning.thinks_first)
    thinks_by_default: bool = False

    def server_info(self) -> dict[str, Any]:
        a = self.args
        info = self.children.scheduler_info
        endpoints = []
        if a.kv_events_port is not None:  # one publisher per DP rank; replay on port + 1
            ports = [port_for_rank(a.kv_events_port, r) for r in range(a.dp_size)]
            endpoints = [
                {
                    "dp_rank": rank,
                    "endpoint": f"tcp://{a.host}:{port}",
                    "replay_endpoint": f"tcp://{a.host}:{port + 1}",
                    "topic": "",
                }
                for rank, port in enumerate(ports)
            ]
        return {
            "model_path": a.model_path,
            "served_model_name": a.model_name,
            "page_size": a.page_size,
            "dp_size": a.dp_size,
            "tp_size": a.tp_size,
            "ep_size": a.ep_size,
            "enable_dp_attention": a.enable_dp_attention,
            "load_balance_method": a.load_balance_method,
            "max_total_num_tokens": info.get("max_total_num_tokens"),
            "max_req_input_len": info.get("max_req_input_len"),
            "max_running_requests": info.get("max_running_requests"),
            "context_length": info.get("context_len"),
            "schedule_policy": a.schedule_policy,
            "chunked_prefill_size": a.chunked_prefill_size,
            "disable_radix_cache": a.disable_radix_cache,
            "speculative_algorithm": a.speculative_algorithm,
            "speculative_num_draft_tokens": a.draft_tokens if a.speculative_algorithm else None,
            "kv_events": endpoints,
            # one entry per DP rank: its scheduler's limits (ranks may differ in pool size)
            "dp_ranks": [
                {
                    "dp_rank": r.get("dp_rank", i),
                    "max_total_num_tokens": r.get("max_total_num_tokens"),
                    "max_running_requests": r.get("max_running_requests"),
                    # HiCache: ranks with the same id read each other's storage pages
                    "hicache_storage_id": r.get("hicache_storage_id"),
                }
                for i, r in enumerate(self.children.rank_infos or [info])
            ],
        }
