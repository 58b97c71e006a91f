"""The scheduler's side of SGLang's expert-distribution endpoints: start (after a reset), stop,
and dump the recorder (layers/expert_distribution.py). A dump is also written, as SGLang's
stat mode writes it, to `$SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR` (default /tmp):
`expert_distribution_recorder_<ts>_dp<r>.pt` = {"rank", "logical_count" [passes, layers,
experts]}, one file per DP rank, which `--init-expert-location` reads back. Beside SGLang's keys
it holds "physical_count" [passes, layers, slots] and "last_physical_to_logical_map" [layers,
slots] (SGLang's name in its per-pass dumps),
the EPLB placement the slots had (layers/expert_location.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from radixserve.engine.ipc.messages import ExpertDistributionOutput
from radixserve.engine.layers.expert_distribution import ExpertDistributionRecorder
from radixserve.engine.layers.expert_location import ExpertLocation

ACTIONS = ("start", "stop", "dump")
OFF = (
    "expert_distribution_recorder_mode is off: start the server with "
    "--expert-distribution-recorder-mode stat (on an MoE model)"
)


def expert_distribution(
    recorder: ExpertDistributionRecorder | None,
    action: str,
    dp_rank: int,
    location: ExpertLocation | None = None,
) -> ExpertDistributionOutput:
    if action not in ACTIONS:
        return ExpertDistributionOutput(False, f"action: expected one of {ACTIONS}, got {action!r}")
    if recorder is None:
        return ExpertDistributionOutput(False, OFF)
    if action == "start":
        recorder.start()
        return ExpertDistributionOutput(True)
    if action == "stop":
        recorder.stop()
        return ExpertDistributionOutput(True)
    counts, physical = recorder.dump()
    placement = (
        location.as_tensor()
        if location is not None
        else torch.arange(recorder.num_experts).repeat(recorder.num_layers, 1)
    )
    folder = Path(os.environ.get("SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR", "/tmp"))
    path = folder / f"expert_distribution_recorder_{time.time_ns()}_dp{dp_rank}.pt"
    record = {
        "rank": dp_rank,
        "logical_count": counts,
        "physical_count": physical,
        "last_physical_to_logical_map": placement,
    }
    try:
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(record, path)
        message = str(path)
    except OSError as exc:  # the counts still go back in the answer
        message = f"not written to {path}: {exc}"
    return ExpertDistributionOutput(
        True,
        message,
        counts.tolist(),
        physical_counts=physical.tolist(),
        physical_to_logical_map=placement.tolist(),
    )
