"""RankSpec: where one scheduler process sits in its replica's ranks. Torch-free, so the
server's parent process can lay out and start its ranks before it imports torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RankSpec:
    """Where one scheduler process sits: its TP rank, the TP size, the rendezvous port, the EP
    size (dividing tp_size), the MoE dispatch mode and, under DP attention, the number of DP
    ranks the world's attention is split into (`attn_dp_size`, dividing tp_size)."""

    tp_rank: int = 0
    tp_size: int = 1
    dist_port: int = 0
    host: str = "127.0.0.1"
    ep_size: int = 1
    moe_a2a_backend: str = "none"
    attn_dp_size: int = 1  # > 1 only with --enable-dp-attention

    @property
    def attn_tp_size(self) -> int:
        return self.tp_size // self.attn_dp_size

    @property
    def dp_rank(self) -> int:
        """The DP rank this process's attention serves (0 without DP attention)."""
        return self.tp_rank // self.attn_tp_size

    @property
    def is_first(self) -> bool:
        """Attention-TP rank 0: reads its DP rank's requests, sends outputs, publishes events."""
        return self.tp_rank % self.attn_tp_size == 0
