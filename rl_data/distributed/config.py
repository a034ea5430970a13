"""Configuration of the distributed data runtime (pydantic, strict, clear errors).

``RuntimeConfig`` says how many logical data shards (rank actors) run, where they are placed
and how they are fed; ``LoaderSpec`` (:mod:`rl_data.energon.loader_spec`, re-exported here)
says what every rank actor builds (everything except the per-rank topology, which the runtime
fills in).
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rl_data.energon.loader_spec import LoaderSpec

__all__ = ["DEFAULT_NAME", "DEFAULT_NAMESPACE", "LoaderSpec", "ParallelLayout", "PlacementStrategy", "RuntimeConfig"]

DEFAULT_NAME = "rl_data_coordinator"
DEFAULT_NAMESPACE = "rl_data"
PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ParallelLayout(_Strict):
    """The trainer's parallel layout: data, tensor, pipeline and context parallel sizes."""

    dp: int = Field(ge=1)
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    cp: int = Field(default=1, ge=1)


class RuntimeConfig(_Strict):
    """How the rank actors and the coordinator run.

    Two layouts, kept apart. The *data* layout: ``logical_world_size`` is the number of logical
    data shards G (one rank actor and one loader each, default ``parallel_layout.dp``), with
    their bundles and strategy; it is part of every loader identity, and a checkpoint restores
    only with the same G. The *consumer* layout, ``parallel_layout`` (DP, TP, PP, CP), may change
    between a save and a restore: DP rank d receives the merged batches of shards d, d+D, ...
    (:mod:`rl_data.distributed.shard_map`), so ``dp`` must divide G.
    """

    parallel_layout: ParallelLayout
    logical_world_size: Optional[int] = Field(default=None, ge=1)
    prefetch_depth: int = Field(default=2, ge=0, description="batches each rank prepares ahead")
    bundle_resources: dict[str, float] = Field(default_factory=lambda: {"CPU": 1.0})
    rank_actor_num_cpus: float = Field(default=1.0, ge=0)
    strategy: PlacementStrategy = "PACK"
    namespace: str = Field(default=DEFAULT_NAMESPACE, min_length=1)
    name: str = Field(default=DEFAULT_NAME, min_length=1)
    lifetime: Optional[Literal["detached"]] = Field(
        default=None,
        description=(
            "None: the actor dies with the process that started it (or when its last handle is "
            "dropped); 'detached': it outlives that process until shutdown and ray.kill, or the cluster stops"
        ),
    )
    step_timeout_s: float = Field(default=600.0, gt=0, description="per rank, per batch")
    control_timeout_s: float = Field(default=300.0, gt=0, description="build/restore/state calls")
    max_rank_restarts: int = Field(default=3, ge=0, description="per rank, over the whole run")
    injected_delay_s: dict[int, float] = Field(
        default_factory=dict,
        description="fault injection only: seconds rank r sleeps before producing each batch",
    )

    @model_validator(mode="after")
    def _check(self) -> "RuntimeConfig":
        from rl_data.distributed.shard_map import check_shard_layout

        world = self.world_size
        check_shard_layout(world, self.parallel_layout.dp)
        if not self.bundle_resources or any(v <= 0 for v in self.bundle_resources.values()):
            raise ValueError(
                f"bundle_resources={self.bundle_resources} must name at least one resource and "
                'every amount must be > 0, e.g. {"CPU": 1.0}'
            )
        bundle_cpus = self.bundle_resources.get("CPU", 0.0)
        if self.rank_actor_num_cpus > bundle_cpus:
            raise ValueError(
                f"rank_actor_num_cpus={self.rank_actor_num_cpus} does not fit in a bundle with "
                f"CPU={bundle_cpus}; raise bundle_resources['CPU'] or lower rank_actor_num_cpus"
            )
        bad = sorted(r for r in self.injected_delay_s if not 0 <= r < world)
        if bad:
            raise ValueError(f"injected_delay_s names ranks {bad} outside [0, {world})")
        return self

    @property
    def world_size(self) -> int:
        """Number of logical data shards (rank actors)."""
        return self.logical_world_size or self.parallel_layout.dp
