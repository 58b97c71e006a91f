"""The MoE experts' balance on /metrics (only for DP ranks whose load carries it: the expert
recorder or EPLB is on): max/mean EP-rank load over the recorder's kept passes (SGLang reports
the same as its `--expert-balancedness-report-mode`), and online EPLB's rebalances, moved
layers and the time spent moving them. Read from each DP rank's LoadOutput at scrape time."""

from __future__ import annotations

from radixserve.engine.tokenizer.load_collector import LoadPartCollector

GAUGES = (
    ("expert_balancedness", "balancedness",
     "max/mean EP-rank load over the recorded passes (1: even; the busiest rank sets the step)"),
    ("expert_recorded_passes", "recorded_passes", "Forward passes the expert recorder holds"),
    ("eplb_max_move_seconds", "max_move_seconds",
     "Longest pause one forward step took to move experts"),
)  # fmt: skip
COUNTERS = (
    ("eplb_rebalances", "rebalances", "Online EPLB rebalances completed"),
    ("eplb_moved_layers", "moved_layers", "MoE layers whose experts moved between EP ranks"),
    ("eplb_move_seconds", "move_seconds", "Time spent moving experts between forward steps"),
)


class ExpertCollector(LoadPartCollector):
    part, counters, gauges = "experts", COUNTERS, GAUGES
