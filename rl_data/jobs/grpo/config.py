"""``GRPODemoConfig``: every option of the GRPO demo job, and the runtime configs it implies."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rl_data.distributed.config import DEFAULT_NAMESPACE, LoaderSpec, ParallelLayout, RuntimeConfig
from rl_data.prompt_feed.client import DEFAULT_FEED_NAME
from rl_data.prompt_feed.epoch_book import DEFAULT_KEPT_EPOCHS
from rl_data.prompt_feed.feed import FeedConfig
from rl_data.prompt_feed.schedules import ScheduleConfig

#: CPU share of one rank actor (and its bundle), of one rollout worker and of the trainer.
RANK_CPUS, WORKER_CPUS, TRAINER_CPUS = 0.5, 0.25, 0.25
DEFAULT_SYSTEM_PROMPT = "Solve the problem step by step. End with a line '#### <answer>'."


class GRPODemoConfig(BaseModel):
    """Options of ``pipelines/grpo_demo.py`` (defaults: 3 epochs of 96 prompts, ~1-2 minutes on 2 cores)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data: Optional[str] = Field(None, description="prepared rl_prompt Energon dataset; default: generated in work_dir")
    work_dir: str = "outputs/grpo_demo"
    num_prompts: int = Field(96, ge=8, description="generated arithmetic word problems (when --data is not given)")
    ranks: int = Field(2, ge=1, description="logical shards: rank actors reading the prompts (the feed's producers)")
    dp: int = Field(2, ge=1, description="data-parallel trainer ranks (gradients averaged over them)")
    resume_dp: Optional[int] = Field(1, ge=1, description="trainer ranks after the kill-everything restore (None: dp)")
    batch_size: int = Field(4, ge=1, description="prompts per rank-actor batch")
    seq_len: int = Field(512, ge=16, description="prompts longer than this are filtered out (counted)")
    system_prompt: Optional[str] = DEFAULT_SYSTEM_PROMPT
    workers: int = Field(3, ge=1, description="rollout workers")
    group_size: int = Field(4, ge=2, description="rollouts per prompt")
    prompts_per_call: int = Field(2, ge=1, description="prompts a worker takes per call")
    groups_per_step: int = Field(4, ge=1, description="trained groups per step")
    max_outstanding: int = Field(24, ge=1, description="the feed's window: prompts out at once (oversampling bound)")
    epochs: int = Field(3, ge=1, description="run until this many epochs are resolved")
    mixture: Optional[dict[str, float]] = Field(
        None, description="deal the generated prompts to weighted mixture members (name -> weight); a mixture has "
        "no passes: the feed is one endless epoch and the run resolves the first --prompts prompts")
    prompts: Optional[int] = Field(None, ge=1, description="with a mixture: prompts to resolve (default num_prompts x epochs)")
    schedule: ScheduleConfig = Field(
        default_factory=ScheduleConfig, description="the feed's prompt schedule, from the groups' outcomes (passes only)"
    )
    checkpoint_every: int = Field(3, ge=1, description="steps between checkpoints")
    kill_worker_at_step: Optional[int] = Field(4, ge=1, description="kill a rollout worker mid-call after this step (None: never)")
    kill_all_at_step: Optional[int] = Field(11, ge=1, description="kill every actor after this step, restore the last checkpoint (None: never)")
    failure_rate: float = Field(0.05, ge=0, lt=1, description="chance that one prompt's generation fails")
    latency_s: float = Field(0.01, ge=0, description="fastest rollout's latency; prompts take 1-12x this")
    seed: int = 0
    namespace: str = Field(DEFAULT_NAMESPACE, min_length=1)
    feed_name: str = Field(DEFAULT_FEED_NAME, min_length=1)
    timeout_s: float = Field(300.0, gt=0)
    progress: bool = True

    @field_validator("work_dir", "data")
    @classmethod
    def _absolute(cls, path: Optional[str]) -> Optional[str]:
        return None if path is None else str(Path(path).expanduser().absolute())

    @model_validator(mode="after")
    def _checks(self) -> "GRPODemoConfig":
        share = self.ranks * self.batch_size
        if self.mixture is not None and (self.data is not None or not self.mixture or min(self.mixture.values()) <= 0):
            raise ValueError("a mixture is made of the generated prompts: leave --data unset and give weights > 0")
        if self.data is None and self.mixture is None and self.num_prompts % share:
            raise ValueError(
                f"num_prompts {self.num_prompts} is not a multiple of ranks x batch_size = {share}; each "
                f"epoch would drop the last partial batch of a rank; use {self.num_prompts // share * share or share}"
            )
        self.schedule.build()  # an unknown schedule or bad options: refused here, not when the feed starts
        if self.mixture is not None and self.schedule != ScheduleConfig():
            raise ValueError(
                f"schedule {self.schedule.name!r} runs over passes: the demo's accounting of a mixture's endless "
                "epoch checks its first positions, which a schedule skips; drop --mixture or --schedule"
            )
        if self.kill_all_at_step is not None and self.kill_all_at_step <= self.checkpoint_every:
            raise ValueError(
                f"kill_all_at_step {self.kill_all_at_step} comes before the first checkpoint (step "
                f"{self.checkpoint_every}); kill after it, or set checkpoint_every lower"
            )
        return self

    @property
    def dataset_path(self) -> str:
        """The dataset, or for a mixture the folder of its members."""
        if self.mixture:
            members = "-".join(f"{n}{w:g}" for n, w in self.mixture.items())
            return str(Path(self.work_dir) / f"prompts-{self.num_prompts}-mixture-{members}")
        return self.data or str(Path(self.work_dir) / f"prompts-{self.num_prompts}")

    @property
    def prompt_target(self) -> int:
        """With a mixture: how many prompts (uids (0, 0..N-1)) the run resolves."""
        return self.prompts or self.num_prompts * self.epochs

    @property
    def checkpoint_dir(self) -> str:
        return str(Path(self.work_dir) / "checkpoint")

    def runtime_config(self) -> RuntimeConfig:
        """The feed's rank actors: one per rank, half a CPU each."""
        return RuntimeConfig(
            parallel_layout=ParallelLayout(dp=self.ranks),
            prefetch_depth=2,
            bundle_resources={"CPU": RANK_CPUS},
            rank_actor_num_cpus=RANK_CPUS,
            namespace=self.namespace,
            name=self.feed_name,
            step_timeout_s=self.timeout_s,
            control_timeout_s=self.timeout_s,
        )

    def loader_spec(self) -> LoaderSpec:
        """The ``rl_prompt`` train split in exact passes (one pass per epoch)."""
        data_config: dict[str, Any] = {
            "energon": {"task": "rl_prompt", "shuffle_buffer_size": 32, "max_samples_per_sequence": 8},
            "shuffle": True,
            "task": {"generation_padding": "left"},
        }
        if self.system_prompt:
            data_config["system_prompt"] = self.system_prompt
        source: dict[str, Any] = {"path": self.dataset_path, "split": "train", "epoch_mode": "exact", "virtual_epoch_length": 0}
        if self.mixture:  # no passes: one endless epoch
            members = [{"name": n, "path": str(Path(self.dataset_path) / n), "weight": w} for n, w in self.mixture.items()]
            source = {"mixture": members, "split": "train", "epoch_mode": "virtual", "virtual_epoch_length": 1000}
        return LoaderSpec(
            data_config=data_config,
            source=source,
            batch_size=self.batch_size,
            max_sequence_length=self.seq_len,
        )

    def feed_config(self) -> FeedConfig:
        # every epoch the accounting checks listed one by one in the feed's status
        kept = max(DEFAULT_KEPT_EPOCHS, self.epochs + 1)
        return FeedConfig(max_outstanding=self.max_outstanding, take_wait_s=1.0, schedule=self.schedule, kept_epochs=kept)
