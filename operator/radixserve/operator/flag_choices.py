"""The choices of the engine's and the router's flags, as those components declare them
(`flag_choices.json`, written by `python -m radixserve.golden_names`: the operator imports
neither component). The spec parser takes its policy names from here, and the tests check
that the CRD's enums are the same names."""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType


def _load(component: str) -> Mapping[str, tuple[str, ...]]:
    text = resources.files("radixserve.operator").joinpath("flag_choices.json").read_text()
    choices = json.loads(text)[component]
    return MappingProxyType({flag: tuple(names) for flag, names in choices.items()})


ENGINE_CHOICES = _load("engine")
ROUTER_CHOICES = _load("router")
ENGINE_POLICIES = ENGINE_CHOICES["--schedule-policy"]  # spec.engine.scheduler.policy
ROUTER_POLICIES = ROUTER_CHOICES["--policy"]  # spec.router.policy
# spec.engine.kvCache.offload.writePolicy
HICACHE_WRITE_POLICIES = ENGINE_CHOICES["--hicache-write-policy"]
# spec.engine.kvCache.offload.storage.prefetchPolicy
HICACHE_PREFETCH_POLICIES = ENGINE_CHOICES["--hicache-storage-prefetch-policy"]
