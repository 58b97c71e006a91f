"""Attention backends behind one interface, chosen once at start-up by name."""

from radixserve.engine.attention.base import AttentionBackend
from radixserve.engine.attention.registry import available_backends, create_attention_backend

__all__ = ["AttentionBackend", "available_backends", "create_attention_backend"]
