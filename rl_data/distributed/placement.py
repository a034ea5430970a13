"""Where the rank actors run, and the placement fingerprint that pins a checkpoint to a layout.

The fingerprint hashes the *logical* layout of the data shards only: the number of logical
shards G (rank actors), the resources of each shard's bundle in shard order and the strategy.
Placement-group and node ids change on every restart and are never part of it, so a job
restarted on new nodes with the same layout restores, and a different layout is refused. The
trainer's parallel layout (DP, TP, PP, CP: the *consumer* layout) is not part of it either: the
stream of a step does not depend on it (see :mod:`rl_data.distributed.shard_map`), so a
checkpoint restores at any DP size that divides G.

A group the runtime creates is named after its coordinator (:func:`placement_group_name`).
Ray removes a group only when both its creator actor and the creator's job are gone, so a
coordinator killed without ``shutdown`` leaves its group reserved while the job runs; the next
coordinator of that name removes it (:func:`remove_leftover_placement_group`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rl_data.distributed.config import RuntimeConfig

#: 2: the trainer's parallel layout left the layout (it is the consumer's, not the data's).
PLACEMENT_LAYOUT_VERSION = 2


def placement_layout(
    *,
    world_size: int,
    bundles: Sequence[Mapping[str, float]],
    strategy: str,
) -> dict[str, Any]:
    """The plain-JSON description of a logical placement of ``world_size`` shards (what the fingerprint hashes)."""
    if len(bundles) != world_size:
        raise ValueError(
            f"placement has {len(bundles)} rank bundles for logical world size {world_size}; "
            "give exactly one bundle per logical rank"
        )
    return {
        "version": PLACEMENT_LAYOUT_VERSION,
        "logical_world_size": int(world_size),
        "bundles": [{k: float(v) for k, v in sorted(b.items())} for b in bundles],
        "strategy": str(strategy),
    }


def placement_fingerprint(layout: Mapping[str, Any]) -> str:
    """sha256 hex of the canonical JSON of ``layout`` (see :func:`placement_layout`)."""
    canonical = json.dumps(layout, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def config_layout(config: RuntimeConfig, bundles: Sequence[Mapping[str, float]] | None = None,
                  strategy: str | None = None) -> dict[str, Any]:
    """The layout of ``config`` (its own bundles and strategy unless others are given)."""
    return placement_layout(
        world_size=config.world_size,
        bundles=bundles if bundles is not None else [config.bundle_resources] * config.world_size,
        strategy=strategy if strategy is not None else config.strategy,
    )


def upgrade_layout_v1(state: Mapping[str, Any]) -> Mapping[str, Any]:
    """A coordinator checkpoint saved with a version-1 layout (which held the parallel layout),
    rewritten as version 2: the layout without ``parallel_layout`` (kept as ``consumer_layout``)
    and every rank identity's ``topology.placement`` that held the old fingerprint given the new
    one (with the rank state's own fingerprint recomputed). Other states are returned as they are.
    """
    from rl_data.fingerprint import fingerprint

    placement = state.get("placement") if isinstance(state, Mapping) else None
    layout = placement.get("layout") if isinstance(placement, Mapping) else None
    if not isinstance(layout, Mapping) or layout.get("version") != 1 or "parallel_layout" not in layout:
        return state
    new_layout = {k: v for k, v in layout.items() if k != "parallel_layout"} | {"version": PLACEMENT_LAYOUT_VERSION}
    old, new = placement_fingerprint(layout), placement_fingerprint(new_layout)
    ranks = []
    for rank in state.get("ranks") or []:
        identity = rank.get("identity") if isinstance(rank, Mapping) else None
        topology = identity.get("topology") if isinstance(identity, Mapping) else None
        if isinstance(topology, Mapping) and topology.get("placement") == old:
            identity = {**identity, "topology": {**topology, "placement": new}}
            rank = {**rank, "identity": identity, "fingerprint": fingerprint(identity)}
        ranks.append(rank)
    return {**state, "placement": {"fingerprint": new, "layout": new_layout},
            "consumer_layout": dict(layout["parallel_layout"]), "ranks": ranks}


def consumer_layout(config: RuntimeConfig) -> dict[str, int]:
    """The trainer's parallel layout (``dp``, ``tp``, ``pp``, ``cp``) as plain JSON."""
    return {k: int(v) for k, v in sorted(config.parallel_layout.model_dump().items())}


@dataclass(frozen=True)
class RankPlacement:
    """A placement group plus the bundle index of every logical rank."""

    placement_group: Any  # ray.util.placement_group.PlacementGroup
    bundle_of_rank: tuple[int, ...]
    layout: dict[str, Any]
    owns_placement_group: bool

    @property
    def fingerprint(self) -> str:
        return placement_fingerprint(self.layout)

    def scheduling_strategy(self, rank: int) -> Any:
        """Ray scheduling strategy that puts ``rank``'s actor into its bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(
            placement_group=self.placement_group,
            placement_group_bundle_index=self.bundle_of_rank[rank],
        )

    def unplaced_bundle(self, rank: int) -> str | None:
        """Why ``rank``'s bundle cannot host its actor now (no node holds it), or None if placed."""
        from ray.util.placement_group import placement_group_table

        table = placement_group_table(self.placement_group)
        bundle = self.bundle_of_rank[rank]
        if table.get("state") == "CREATED" and table.get("bundles_to_node_id", {}).get(bundle):
            return None
        return (
            f"its bundle {bundle} {self.layout['bundles'][rank]} of the {table.get('strategy')} "
            f"placement group is not placed on any node (group state {table.get('state')}): the "
            "cluster cannot satisfy the placement now; add nodes with free resources for every "
            "bundle, or restart with a strategy the remaining nodes satisfy"
        )

    def release(self) -> None:
        """Remove the placement group if this runtime created it (never a user's group)."""
        if self.owns_placement_group:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.placement_group)


def placement_group_name(config: RuntimeConfig) -> str:
    """The name of the placement group the coordinator ``config.name`` in ``config.namespace`` creates."""
    return f"rl_data.coordinator:{config.namespace}/{config.name}"


def remove_leftover_placement_group(config: RuntimeConfig) -> list[str]:
    """Remove every live group named :func:`placement_group_name` (left by a dead coordinator).

    Call it only from the coordinator that holds ``config.name``: no other live coordinator can
    then own such a group. Returns the ids of the removed groups.
    """
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

    name = placement_group_name(config)
    removed = []
    for group_id, entry in placement_group_table().items():
        if entry.get("name") == name and entry.get("state") != "REMOVED":
            remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(group_id))))
            removed.append(group_id)
    return removed


def create_rank_placement(config: RuntimeConfig) -> RankPlacement:
    """Create a placement group with one ``config.bundle_resources`` bundle per logical rank."""
    from ray.util.placement_group import placement_group

    bundles = [dict(config.bundle_resources) for _ in range(config.world_size)]
    group = placement_group(bundles, strategy=config.strategy, name=placement_group_name(config))
    return RankPlacement(group, tuple(range(config.world_size)), config_layout(config), True)


def adopt_placement_group(group: Any, bundle_of_rank: Sequence[int], config: RuntimeConfig) -> RankPlacement:
    """Use a placement group the training framework created; rank r runs in ``bundle_of_rank[r]``.

    The fingerprint uses the resources of each rank's bundle (in rank order) and the group's
    strategy; ``config.bundle_resources`` and ``config.strategy`` are ignored.
    """
    from ray.util.placement_group import placement_group_table

    specs = group.bundle_specs
    if len(bundle_of_rank) != config.world_size:
        raise ValueError(
            f"bundle_of_rank has {len(bundle_of_rank)} entries for logical world size "
            f"{config.world_size}; give one bundle index per logical rank"
        )
    bad = [b for b in bundle_of_rank if not 0 <= b < len(specs)]
    if bad:
        raise ValueError(
            f"bundle indices {bad} are outside the placement group's {len(specs)} bundles"
        )
    bundles = [specs[b] for b in bundle_of_rank]
    short = [r for r, b in enumerate(bundles) if b.get("CPU", 0.0) < config.rank_actor_num_cpus]
    if short:
        raise ValueError(
            f"bundles of ranks {short} have fewer CPUs than rank_actor_num_cpus="
            f"{config.rank_actor_num_cpus}; lower rank_actor_num_cpus (0 is allowed) or map "
            "those ranks to bundles with spare CPU"
        )
    strategy = placement_group_table(group)["strategy"]
    layout = config_layout(config, bundles=bundles, strategy=strategy)
    return RankPlacement(group, tuple(int(b) for b in bundle_of_rank), layout, False)
