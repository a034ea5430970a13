"""What one benchmark run measures: the shared workload and run lengths (full or ``--quick``)."""

from __future__ import annotations

from typing import Literal

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
    #: Alternating rounds of the chat-formatting micro-benchmark, best kept (truncation: at most 2).
    chat_rounds: int = Field(default=5, ge=1)
    #: Repetitions of the 32 MB object-store hop.
    transfer_repeats: int = Field(default=10, ge=1)
    #: Real batches per mode and alternating rounds of the worker-to-loader item micro-benchmark.
    worker_item_batches: int = Field(default=40, ge=1)
    worker_item_rounds: int = Field(default=5, ge=1)
    #: Batches per mode and Energon worker counts of the rank-state micro-benchmark.
    state_batches: int = Field(default=40, ge=1)
    state_worker_counts: tuple[int, ...] = (2, 4)
    #: Energon workers per rank actor (b) and DataLoader workers (d, 0: in-process) of the
    #: worker sweep (1 rank actor / 1 loader, every mode of ``modes``).
    worker_counts: tuple[int, ...] = (0, 1, 2, 4)
    #: Samples per run and rounds of the sweep contenders (worker sweep, VLM, 4-rank restore
    #: with workers): shorter than ``samples_per_run`` and fewer rounds keep the suite ~30 min.
    sweep_samples_per_run: int = Field(default=4_000, ge=1)
    sweep_rounds: int = Field(default=1, ge=0)
    #: Energon workers per rank of the extra ``restore_ranks``-rank contenders (restore target;
    #: 0 workers is ``b_rl_data_<restore_ranks>rank`` of ``rank_counts``).
    restore_ranks: int = Field(default=4, ge=1)
    restore_worker_counts: tuple[int, ...] = (2,)
    #: VLM workload (``benchmarks/vlm.py``): samples (one JPEG each), picture side in pixels,
    #: samples per shard / JSONL file, batch size, maximum length, samples per run (more than
    #: the text sweep's share of start-up: the multimodal processor imports take seconds; the
    #: loader d reads one pass, so keep it below ``vlm_samples`` minus the wait phase), workers.
    vlm_samples: int = Field(default=3_000, ge=1)
    vlm_image_size: int = Field(default=448, ge=28)
    vlm_samples_per_shard: int = Field(default=100, ge=1)
    vlm_batch_size: int = Field(default=8, ge=1)
    vlm_max_sequence_length: int = Field(default=1024, ge=16)
    vlm_samples_per_run: int = Field(default=2_400, ge=1)
    vlm_worker_counts: tuple[int, ...] = (0, 2)
    #: First step from a fresh Ray session, cold / torch / loader stack preloaded
    #: (``benchmarks/warm_start.py``): rank counts, variants and interleaved repeats (0: not run).
    warm_start_rank_counts: tuple[int, ...] = (1, 2)
    warm_start_variants: tuple[Literal["cold", "torch", "preload"], ...] = ("cold", "torch", "preload")
    warm_start_repeats: int = Field(default=2, ge=0)
    seed: int = 1234
    #: Seconds any single Ray call may take before the run fails.
    ray_timeout_s: float = Field(default=300.0, gt=0)

    @classmethod
    def quick(cls) -> "BenchSettings":
        """A small run for the smoke test (well-formed outputs, not meaningful timings).

        The full run's code paths, a path that several runs share once: one map actor /
        DataLoader worker (``parallelism`` 1); the restore contender has 1 rank, so it is also the
        worker sweep's b (``b_rl_data_1rank_w2``); VLM at 2 workers only (0 workers: the text
        contenders' path); warm start with 2 ranks (the run's only multi-rank coordinator),
        preloaded only (cold and torch-only differ by the module list).
        """
        return cls(
            num_conversations=600,
            samples_per_shard=50,
            batch_size=4,
            max_sequence_length=1024,
            packing_buffer_size=16,
            samples_per_run=48,
            rounds=1,
            wait_steps=3,
            parallelism=1,
            modes=("packed",),
            rank_counts=(1,),
            micro_conversations=60,
            chat_rounds=1,
            transfer_repeats=2,
            worker_item_batches=4,
            worker_item_rounds=1,
            state_batches=4,
            state_worker_counts=(2,),
            ray_timeout_s=60.0,
            worker_counts=(2,),
            sweep_samples_per_run=48,
            restore_ranks=1,
            restore_worker_counts=(2,),
            vlm_samples=64,
            vlm_image_size=224,
            vlm_samples_per_shard=16,
            vlm_batch_size=4,
            vlm_max_sequence_length=512,
            vlm_samples_per_run=24,
            vlm_worker_counts=(2,),
            warm_start_rank_counts=(2,),
            warm_start_variants=("preload",),
            warm_start_repeats=1,
        )
