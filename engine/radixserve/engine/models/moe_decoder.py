"""MoeForCausalLM: the Llama decoder with the MoE MLP (`layers.moe.SparseMoeBlock`) on the
sparse layers that `ModelConfig.moe` names and the dense MLP elsewhere. Qwen3-MoE, Qwen2-MoE
and Mixtral subclass it, one file each; attention, norms, rotary, embedding and LM head are
Llama's unchanged (Qwen3's q/k norm and Qwen2's q/k/v biases come from ModelConfig as for the
dense models).

Loading: per-expert checkpoint tensors (`…mlp.experts.{e}.{gate,up,down}_proj.weight`, or
Mixtral's `w1/w3/w2`) go into the stacked `w13_weight` / `w2_weight` of their layer, as do
transformers 5's stacked `…mlp.experts.{gate_up,down}_proj`; everything else takes Llama's
path. A tensor of an expert this rank does not hold is skipped unread. Runs in the scheduler
process.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import replace
from functools import partial

from torch import nn

from radixserve.engine.configs.model_config import ModelConfig
from radixserve.engine.distributed import GroupHandle, ParallelGroups
from radixserve.engine.layers.expert_location import ExpertLocation
from radixserve.engine.layers.moe import ExpertShard, FusedMoE, SparseMoeBlock
from radixserve.engine.model_loader.weight import Weight, read_full
from radixserve.engine.models.llama import LlamaForCausalLM, MlpFactory, dense_mlp

_EXPERT = re.compile(
    r"^(?P<experts>.+\.mlp\.experts)\.(?P<expert>\d+)\."
    r"(?P<proj>gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$"
)
_STACKED_EXPERTS = re.compile(r"^(?P<experts>.+\.mlp\.experts)\.(?P<proj>gate_up_proj|down_proj)$")
_SHARDS: dict[str, tuple[ExpertShard, ...]] = {
    "gate_proj": ("w1",),
    "up_proj": ("w3",),
    "down_proj": ("w2",),
    "w1": ("w1",),
    "w3": ("w3",),
    "w2": ("w2",),
    "gate_up_proj": ("w1", "w3"),
}
_ALL_SHARDS: tuple[ExpertShard, ...] = ("w1", "w2", "w3")

# (experts module path, global expert id, shard) of every expert tensor met while loading
_Seen = set[tuple[str, int, ExpertShard]]


class MoeForCausalLM(LlamaForCausalLM):
    """A Llama-shaped decoder whose sparse layers' MLP is a SparseMoeBlock; `expert_location`
    (EPLB's placement over the EP ranks, layers/expert_location.py) defaults to slot e =
    expert e."""

    def __init__(
        self,
        config: ModelConfig,
        groups: ParallelGroups | None = None,
        expert_location: ExpertLocation | None = None,
    ) -> None:
        # read by mlp_factory, which the base constructor calls (a plain attribute may be set
        # before nn.Module's own)
        self.expert_location = expert_location
        super().__init__(config, groups)

    def mlp_factory(self, groups: ParallelGroups) -> MlpFactory:
        return partial(
            self.make_mlp,
            ep=groups.ep,
            a2a_backend=groups.moe_a2a_backend,
            location=self.expert_location,
        )

    @staticmethod
    def make_mlp(
        config: ModelConfig,
        layer_id: int,
        tp: GroupHandle,
        ep: GroupHandle | None = None,
        a2a_backend: str = "none",
        location: ExpertLocation | None = None,
    ) -> nn.Module:
        """SparseMoeBlock on sparse layers, else the dense MLP. Under TP the routed experts are
        replicated on every rank of an EP group and partitioned over its `ep` ranks (one
        contiguous slice of slots each, as `location` places them; joined by `a2a_backend`);
        a shared expert is Llama's tensor-parallel MLP at `shared_expert_intermediate_size`."""
        moe = config.moe
        if moe is None or not moe.is_sparse_layer(layer_id):
            return dense_mlp(config, layer_id, tp)
        shared_size = moe.shared_expert_intermediate_size
        shared = (
            dense_mlp(replace(config, intermediate_size=shared_size), layer_id, tp)
            if shared_size
            else None
        )
        placement = location.layer(layer_id) if location is not None else None
        return SparseMoeBlock(
            moe, config.hidden_size, shared, ep=ep, a2a_backend=a2a_backend, layer_id=layer_id,
            placement=placement,
        )  # fmt: skip

    def checkpoint_name(self, name: str) -> str:
        """Checkpoint tensor name → our parameter path (Mixtral renames its MoE block)."""
        return name

    def load_weights(self, weights: Iterable[tuple[str, Weight]]) -> None:
        """Llama's loading, plus a check that every held expert got all three matrices."""
        seen: _Seen = set()
        super().load_weights(self._note_experts(weights, seen))
        for path, module in self.named_modules():
            if isinstance(module, FusedMoE):
                want = {(path, e, s) for e in set(module.slot_experts) for s in _ALL_SHARDS}
                if absent := sorted(want - seen):
                    raise ValueError(f"checkpoint is missing expert weights: {absent[:3]} …")

    def _note_experts(
        self, weights: Iterable[tuple[str, Weight]], seen: _Seen
    ) -> Iterator[tuple[str, Weight]]:
        """Pass the tensors on unchanged, recording which expert matrices went by."""
        for name, w in weights:
            target = self.checkpoint_name(name)
            if m := _EXPERT.match(target):
                seen.update((m["experts"], int(m["expert"]), s) for s in _SHARDS[m["proj"]])
            elif m := _STACKED_EXPERTS.match(target):
                ids = set(self._experts(m["experts"]).slot_experts)
                seen.update((m["experts"], e, s) for e in ids for s in _SHARDS[m["proj"]])
            yield name, w

    def _load_one(self, params: dict[str, nn.Parameter], name: str, w: Weight) -> str:
        target = self.checkpoint_name(name)
        if m := _EXPERT.match(target):
            return self._load_expert(m["experts"], int(m["expert"]), m["proj"], w)
        if m := _STACKED_EXPERTS.match(target):
            is_gate_up = m["proj"] == "gate_up_proj"
            self._experts(m["experts"]).load_stacked(
                "gate_up_proj" if is_gate_up else "down_proj", read_full(w)
            )
            return f"{m['experts']}.{'w13_weight' if is_gate_up else 'w2_weight'}"
        return super()._load_one(params, target, w)

    def _load_expert(self, path: str, expert_id: int, proj: str, w: Weight) -> str:
        module = self._experts(path)
        (shard,) = _SHARDS[proj]
        if module.holds_expert(expert_id):  # another rank's expert is never read
            module.load_expert(expert_id, shard, read_full(w))
        return f"{path}.{'w2_weight' if shard == 'w2' else 'w13_weight'}"

    def _experts(self, path: str) -> FusedMoE:
        try:
            module = self.get_submodule(path)
        except AttributeError:
            module = None
        if not isinstance(module, FusedMoE):
            raise ValueError(f"checkpoint has experts at {path!r}, a layer without MoE here")
        return module
