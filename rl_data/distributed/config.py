"""Configuration of the distributed data runtime (pydantic, strict, clear errors).

``RuntimeConfig`` says how many logical data shards (rank actors) run, where they are placed
and how they are fed; ``LoaderSpec`` (:mod:`rl_data.energon.loader_spec`, re-exported here)
says what every rank actor builds (everything except the per-rank topology, which the runtime
fills in).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rl_data.config_blocks import validator_error
from rl_data.energon.driver_checks import loader_spec_problems
from rl_data.energon.loader_spec import LoaderSpec

__all__ = [
    "DEFAULT_NAME", "DEFAULT_NAMESPACE", "LoaderSpec", "ParallelLayout", "PlacementStrategy", "RuntimeConfig", "start_problems",
]

DEFAULT_NAME = "rl_data_coordinator"
DEFAULT_NAMESPACE = "rl_data"
PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ParallelLayout(_Strict):
    """The trainer's parallel layout: data, tensor, pipeline and context parallel sizes."""

    dp: int = Field(ge=1, description="Data-parallel size D: the ranks that each receive their own batch; it must divide G.")
    tp: int = Field(
        default=1, ge=1,
        description="Tensor-parallel size of the trainer (recorded in checkpoints; the data does not depend on it).",
    )  # fmt: skip
    pp: int = Field(
        default=1, ge=1,
        description="Pipeline-parallel size of the trainer (recorded in checkpoints; the data does not depend on it).",
    )  # fmt: skip
    cp: int = Field(
        default=1, ge=1,
        description="Context-parallel size of the trainer (recorded in checkpoints; the data does not depend on it).",
    )  # fmt: skip


class RuntimeConfig(_Strict):
    """How the rank actors and the coordinator run.

    Two layouts, kept apart. The *data* layout: ``logical_world_size`` is the number of logical
    data shards G (one rank actor and one loader each, default ``parallel_layout.dp``), with
    their bundles and strategy; it is part of every loader identity, and a checkpoint restores
    only with the same G. The *consumer* layout, ``parallel_layout`` (DP, TP, PP, CP), may change
    between a save and a restore: DP rank d receives the merged batches of shards d, d+D, ...
    (:mod:`rl_data.distributed.shard_map`), so ``dp`` must divide G.
    """

    parallel_layout: ParallelLayout = Field(description="The trainer's parallel layout (DP, TP, PP, CP).")
    logical_world_size: Optional[int] = Field(
        default=None, ge=1,
        description="Logical data shards G, one rank actor each (None: parallel_layout.dp); a checkpoint restores only "
        "with the same G.",
    )  # fmt: skip
    prefetch_depth: int = Field(default=2, ge=0, description="Batches each rank actor prepares ahead.")
    bundle_resources: dict[str, float] = Field(
        default_factory=lambda: {"CPU": 1.0}, description="Resources of each rank's placement-group bundle."
    )
    rank_actor_num_cpus: float = Field(
        default=1.0, ge=0, description="CPUs each rank actor reserves in its bundle (at most the bundle's CPU)."
    )
    strategy: PlacementStrategy = Field(default="PACK", description="Ray placement strategy of the rank bundles.")
    namespace: str = Field(
        default=DEFAULT_NAMESPACE, min_length=1, description="Ray namespace the coordinator (or feed) is registered in."
    )
    name: str = Field(default=DEFAULT_NAME, min_length=1, description="Name of the coordinator (or feed) actor.")
    lifetime: Optional[Literal["detached"]] = Field(
        default=None,
        description=(
            "None: the actor dies with the process that started it (or when its last handle is "
            "dropped); 'detached': it outlives that process until shutdown and ray.kill, or the cluster stops."
        ),
    )
    step_timeout_s: float = Field(default=600.0, gt=0, description="Seconds each rank may take per batch.")
    control_timeout_s: float = Field(
        default=300.0, gt=0, description="Seconds each rank may take to build, restore or report its state."
    )
    max_rank_restarts: int = Field(
        default=3, ge=0, description="Deaths of one rank actor replaced over the whole run before the run fails."
    )
    release_delay_steps: int = Field(
        default=2, ge=0,
        description="Steps after its commit (or a rewind) that the coordinator still holds a step's batch refs, so "
        "that consumers release them first: Ray keeps an owned object in its owner's memory for good when a "
        "borrower's release is the last. Raise it for consumers that hold batches longer; each step held "
        "stays in the object store.",
    )  # fmt: skip
    injected_delay_s: dict[int, float] = Field(
        default_factory=dict,
        description="Fault injection for tests only: seconds rank r sleeps before producing each batch.",
    )

    @model_validator(mode="after")
    def _check(self) -> "RuntimeConfig":
        from rl_data.distributed.shard_map import check_shard_layout

        problems = []
        world = self.world_size
        try:
            check_shard_layout(world, self.parallel_layout.dp)
        except ValueError as error:
            problems.append(str(error))
        if not self.bundle_resources or any(v <= 0 for v in self.bundle_resources.values()):
            problems.append(
                f"bundle_resources={self.bundle_resources} must name at least one resource and "
                'every amount must be > 0, e.g. {"CPU": 1.0}'
            )
        bundle_cpus = self.bundle_resources.get("CPU", 0.0)
        if self.rank_actor_num_cpus > bundle_cpus:
            problems.append(
                f"rank_actor_num_cpus={self.rank_actor_num_cpus} does not fit in a bundle with "
                f"CPU={bundle_cpus}; raise bundle_resources['CPU'] or lower rank_actor_num_cpus"
            )
        bad = sorted(r for r in self.injected_delay_s if not 0 <= r < world)
        if bad:
            problems.append(f"injected_delay_s names ranks {bad} outside [0, {world}); name ranks of the logical world size only")
        if problems:
            raise validator_error("RuntimeConfig", problems)
        return self

    @property
    def world_size(self) -> int:
        """Number of logical data shards (rank actors)."""
        return self.logical_world_size or self.parallel_layout.dp


def start_problems(
    config: Any,
    loader_spec: Any,
    *,
    placement_group: Any = None,
    bundle_of_rank: Optional[Sequence[int]] = None,
    check_datasets: bool = True,
) -> list[str]:
    """What starting rank actors for ``config`` and ``loader_spec`` would fail on, found on the driver
    before anything starts: the argument types, the datasets' metadata and the processor factory
    (:func:`rl_data.energon.driver_checks.loader_spec_problems`; ``check_datasets=False`` skips the
    datasets), and an adopted placement group's bundles ([]: nothing)."""
    problems = []
    if not isinstance(config, RuntimeConfig):
        problems.append(f"config is a {type(config).__name__}, expected a RuntimeConfig; build one with RuntimeConfig(...)")
    if isinstance(loader_spec, LoaderSpec):
        problems += loader_spec_problems(loader_spec, check_datasets=check_datasets)
    else:
        problems.append(f"loader_spec is a {type(loader_spec).__name__}, expected a LoaderSpec; build one with LoaderSpec(...)")
    if placement_group is None and bundle_of_rank is not None:
        problems.append(
            f"bundle_of_rank is {list(bundle_of_rank)} but placement_group is None, expected both or neither: the indices "
            "name bundles of a group the caller created; pass that group as placement_group, or drop bundle_of_rank"
        )
    elif placement_group is not None and isinstance(config, RuntimeConfig):
        from rl_data.distributed.placement import adopt_placement_group  # it imports this module

        try:
            adopt_placement_group(placement_group, bundle_of_rank or (), config)  # computes only: starts nothing
        except ValueError as error:
            problems.append(str(error))
    return problems
