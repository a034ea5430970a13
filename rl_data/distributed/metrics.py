"""Ray metrics of the data runtime: what every rank hands out and how the coordinator steps.

Metrics are ``ray.util.metrics`` objects, created once per process on first use (in the rank
actor or coordinator process) and exported by each node's metrics agent as Prometheus series
``ray_<name>`` (counters get ``_total``). Names and tags:

* per rank, tags ``coordinator`` (its ``RuntimeConfig.name``) and ``rank``:
  ``rl_data_rank_batches``, ``rl_data_rank_samples``, ``rl_data_rank_non_pad_tokens`` (counters of
  what ``next_batch`` handed out), ``rl_data_rank_packing_efficiency`` (gauge: real tokens / pack
  capacity of the last handed-out packed batch), ``rl_data_rank_skipped_samples`` (counter of bad
  samples the loader skipped), ``rl_data_rank_filtered_samples`` (counter of samples the task
  filtered out on purpose, e.g. RL prompts over the length limit), ``rl_data_rank_zero_loss_samples`` (counter of handed-out samples
  with ``loss_multiplier`` 0: over-length samples cut to stubs, trained on nothing),
  ``rl_data_rank_prefetch_depth`` (gauge: batches ready),
  ``rl_data_rank_blocked_seconds`` (counter: time ``next_batch`` waited for a batch);
* per coordinator, tag ``coordinator``: ``rl_data_coordinator_steps`` (counter of steps handed
  out), ``rl_data_coordinator_step_latency_seconds`` (histogram of ``next_step`` wall time),
  ``rl_data_coordinator_restores`` (counter, tag ``kind``: ``checkpoint`` or ``rank_recovery``),
  ``rl_data_coordinator_committed_step`` (gauge).

:func:`batch_stats` is pure; the recorders only need a connected Ray worker.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

from rl_data.batch_stats import BatchStats

RANK_TAGS = ("coordinator", "rank")
COORDINATOR_TAGS = ("coordinator",)
RESTORE_TAGS = ("coordinator", "kind")
STEP_LATENCY_BOUNDARIES_S = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
RestoreKind = Literal["checkpoint", "rewind", "rank_recovery"]


@dataclass(frozen=True)
class _Definitions:
    rank_batches: Any
    rank_samples: Any
    rank_non_pad_tokens: Any
    rank_packing_efficiency: Any
    rank_skipped_samples: Any
    rank_filtered_samples: Any
    rank_zero_loss_samples: Any
    rank_prefetch_depth: Any
    rank_blocked_seconds: Any
    coordinator_steps: Any
    coordinator_step_latency: Any
    coordinator_restores: Any
    coordinator_committed_step: Any


@functools.cache
def _definitions() -> _Definitions:
    """Every metric, created on first use in this process (Ray registers each once)."""
    from ray.util.metrics import Counter, Gauge, Histogram

    return _Definitions(
        rank_batches=Counter("rl_data_rank_batches", "Batches handed out by a rank", RANK_TAGS),
        rank_samples=Counter("rl_data_rank_samples", "Source samples in the batches handed out", RANK_TAGS),
        rank_non_pad_tokens=Counter("rl_data_rank_non_pad_tokens", "Real (non-pad) tokens handed out", RANK_TAGS),
        rank_packing_efficiency=Gauge(
            "rl_data_rank_packing_efficiency", "Real tokens / pack capacity of the last packed batch", RANK_TAGS
        ),
        rank_skipped_samples=Counter("rl_data_rank_skipped_samples", "Bad samples skipped by the loader", RANK_TAGS),
        rank_filtered_samples=Counter(
            "rl_data_rank_filtered_samples", "Samples the task filtered out (e.g. RL prompts over length)", RANK_TAGS
        ),
        rank_zero_loss_samples=Counter(
            "rl_data_rank_zero_loss_samples", "Handed-out samples with loss_multiplier 0 (over length, cut)", RANK_TAGS
        ),
        rank_prefetch_depth=Gauge("rl_data_rank_prefetch_depth", "Batches produced and ready to hand out", RANK_TAGS),
        rank_blocked_seconds=Counter(
            "rl_data_rank_blocked_seconds", "Seconds next_batch waited for a batch to be produced", RANK_TAGS
        ),
        coordinator_steps=Counter("rl_data_coordinator_steps", "Steps handed out", COORDINATOR_TAGS),
        coordinator_step_latency=Histogram(
            "rl_data_coordinator_step_latency_seconds",
            "Wall time of next_step",
            STEP_LATENCY_BOUNDARIES_S,
            COORDINATOR_TAGS,
        ),
        coordinator_restores=Counter(
            "rl_data_coordinator_restores", "Checkpoint loads and rank recoveries", RESTORE_TAGS
        ),
        coordinator_committed_step=Gauge("rl_data_coordinator_committed_step", "Last committed step", COORDINATOR_TAGS),
    )


class RankMetrics:
    """Records the metrics of logical rank ``rank`` of the coordinator ``coordinator``."""

    def __init__(self, coordinator: str, rank: int) -> None:
        self._tags = {"coordinator": coordinator, "rank": str(rank)}
        self._skipped_seen = self._filtered_seen = 0

    def record_produced(self, *, skipped_samples: int, filtered_samples: int = 0, ready: int) -> None:
        """A batch was produced; ``skipped_samples`` and ``filtered_samples`` are the loader's running totals."""
        metrics = _definitions()
        if skipped_samples > self._skipped_seen:
            metrics.rank_skipped_samples.inc(skipped_samples - self._skipped_seen, self._tags)
            self._skipped_seen = skipped_samples
        if filtered_samples > self._filtered_seen:
            metrics.rank_filtered_samples.inc(filtered_samples - self._filtered_seen, self._tags)
            self._filtered_seen = filtered_samples
        metrics.rank_prefetch_depth.set(ready, self._tags)

    def record_handed_out(self, stats: BatchStats, *, waited_s: float, ready: int) -> None:
        """``next_batch`` handed out a batch after waiting ``waited_s`` for it."""
        metrics = _definitions()
        metrics.rank_batches.inc(1, self._tags)
        if stats.samples:
            metrics.rank_samples.inc(stats.samples, self._tags)
        if stats.non_pad_tokens:
            metrics.rank_non_pad_tokens.inc(stats.non_pad_tokens, self._tags)
        if stats.zero_loss_samples:
            metrics.rank_zero_loss_samples.inc(stats.zero_loss_samples, self._tags)
        if stats.packing_efficiency is not None:
            metrics.rank_packing_efficiency.set(stats.packing_efficiency, self._tags)
        if waited_s > 0:
            metrics.rank_blocked_seconds.inc(waited_s, self._tags)
        metrics.rank_prefetch_depth.set(ready, self._tags)


class CoordinatorMetrics:
    """Records the metrics of the coordinator named ``coordinator``."""

    def __init__(self, coordinator: str) -> None:
        self._tags = {"coordinator": coordinator}

    def record_step(self, latency_s: float) -> None:
        """``next_step`` handed out a step after ``latency_s`` seconds."""
        metrics = _definitions()
        metrics.coordinator_steps.inc(1, self._tags)
        metrics.coordinator_step_latency.observe(latency_s, self._tags)

    def record_committed(self, step: int) -> None:
        """``step`` is now the committed step (after a commit or a restore)."""
        _definitions().coordinator_committed_step.set(step, self._tags)

    def record_restore(self, kind: RestoreKind) -> None:
        """A checkpoint was loaded (into fresh ranks, or as a rewind) or a dead rank was replaced and restored."""
        _definitions().coordinator_restores.inc(1, {**self._tags, "kind": kind})
