"""What one benchmark run measures: the shared workload and run lengths (full or ``--quick``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BenchSettings(BaseModel):
    """Workload and run lengths shared by every contender, so all do the same work."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Conversations in the dataset (the 4,017 real chitchat ones, then resampled ones).
    num_conversations: int = Field(default=20_000, ge=10)
    #: Samples per Energon tar shard (and per JSONL file for Ray Data / torchdata).
    samples_per_shard: int = Field(default=500, ge=1)
    batch_size: int = Field(default=16, ge=1)
    max_sequence_length: int = Field(default=4096, ge=16)
    sequence_length_pad_multiple: int = Field(default=8, ge=1)
    packing_algorithm: str = "first_fit_decreasing"
    packing_buffer_size: int = Field(default=128, ge=1)
    #: Samples each contender delivers in the throughput phase (no train step): long enough
    #: that start-up (seconds) is a small share, as in a training job.
    samples_per_run: int = Field(default=10_000, ge=1)
    #: Rounds over all contenders; each contender's figures are from its fastest round.
    rounds: int = Field(default=2, ge=1)
    #: Steps of the wait phase (simulated train step slower than production).
    wait_steps: int = Field(default=30, ge=3)
    #: Train step = this factor x the contender's own production time per step.
    train_step_factor: float = Field(default=1.5, gt=1.0)
    #: Parallel producers of the equal-CPU comparison (rank actors, map actors, workers).
    parallelism: int = Field(default=2, ge=1)
    #: Packing modes measured for every contender.
    modes: tuple[str, ...] = ("unpacked", "packed")
    #: Logical ranks of the rl_data contender runs.
    rank_counts: tuple[int, ...] = (1, 2, 4)
    #: Conversations used by the micro-benchmarks.
    micro_conversations: int = Field(default=2_000, ge=1)
    #: Repetitions of the 32 MB object-store hop.
    transfer_repeats: int = Field(default=10, ge=1)
    seed: int = 1234
    #: Seconds any single Ray call may take before the run fails.
    ray_timeout_s: float = Field(default=300.0, gt=0)

    @classmethod
    def quick(cls) -> "BenchSettings":
        """A small run for the smoke test (well-formed outputs, not meaningful timings)."""
        return cls(
            num_conversations=600,
            samples_per_shard=50,
            batch_size=4,
            max_sequence_length=1024,
            packing_buffer_size=16,
            samples_per_run=48,
            rounds=1,
            wait_steps=3,
            modes=("packed",),
            rank_counts=(1,),
            micro_conversations=60,
            transfer_repeats=2,
            ray_timeout_s=60.0,
        )
