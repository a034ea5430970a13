"""Ray metrics of the data runtime: what every rank hands out and how the coordinator steps.

The metrics are data: each :class:`MetricDefinition` below (name, kind, description, tag keys,
histogram boundaries) is declared at module level, so the documentation reads them without Ray.
:func:`_created` makes the ``ray.util.metrics`` objects from them once per process, on first use
(in a rank actor or the coordinator); each node's metrics agent exports them as Prometheus series
``ray_<name>`` (counters with ``_total``).

:func:`batch_stats` is pure; the recorders only need a connected Ray worker.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

from rl_data.batch_stats import BatchStats

MetricKind = Literal["counter", "gauge", "histogram"]
RestoreKind = Literal["checkpoint", "rewind", "rank_recovery"]


@dataclass(frozen=True)
class MetricDefinition:
    """One Ray metric: its name, kind, description, tag keys and (histograms) bucket boundaries."""

    name: str
    kind: MetricKind
    description: str
    tag_keys: tuple[str, ...]
    boundaries: tuple[float, ...] = ()

    @property
    def series(self) -> str:
        """The Prometheus series name: ``ray_<name>``, with ``_total`` for a counter (a histogram's
        series add ``_bucket``, ``_sum`` and ``_count`` to it)."""
        return f"ray_{self.name}_total" if self.kind == "counter" else f"ray_{self.name}"

    def create(self) -> Any:
        """The ``ray.util.metrics`` object (Ray registers each name once per process)."""
        from ray.util.metrics import Counter, Gauge, Histogram

        if self.kind == "histogram":
            return Histogram(self.name, self.description, list(self.boundaries), self.tag_keys)
        return {"counter": Counter, "gauge": Gauge}[self.kind](self.name, self.description, self.tag_keys)


def create_all(definitions: tuple[MetricDefinition, ...]) -> dict[str, Any]:
    """``{name: ray metric}`` for ``definitions``."""
    return {definition.name: definition.create() for definition in definitions}


#: What each tag of the runtime's metrics holds.
TAGS: dict[str, str] = {
    "coordinator": "the coordinator's (or prompt feed's) `RuntimeConfig.name`",
    "rank": "the logical rank (data shard) 0 .. G-1",
    "kind": "`checkpoint` (a checkpoint loaded into a fresh coordinator or feed), `rewind` (one loaded "
    "into a live one) or `rank_recovery` (a dead rank replaced and restored)",
}
RANK_TAGS = ("coordinator", "rank")
COORDINATOR_TAGS = ("coordinator",)
RESTORE_TAGS = ("coordinator", "kind")
STEP_LATENCY_BOUNDARIES_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CHECKPOINT_SECONDS_BOUNDARIES_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

RANK_BATCHES = MetricDefinition(
    "rl_data_rank_batches", "counter", "Batches handed out by the rank's next_batch", RANK_TAGS
)
RANK_SAMPLES = MetricDefinition(
    "rl_data_rank_samples", "counter", "Source samples in the batches handed out", RANK_TAGS
)
RANK_NON_PAD_TOKENS = MetricDefinition(
    "rl_data_rank_non_pad_tokens", "counter", "Real (non-pad) tokens in the batches handed out", RANK_TAGS
)
RANK_PACKING_EFFICIENCY = MetricDefinition(
    "rl_data_rank_packing_efficiency",
    "gauge",
    "Real tokens / pack capacity of the last packed batch handed out",
    RANK_TAGS,
)
RANK_SKIPPED_SAMPLES = MetricDefinition(
    "rl_data_rank_skipped_samples",
    "counter",
    "Bad samples the loader skipped (within its failure budget)",
    RANK_TAGS,
)
RANK_FILTERED_SAMPLES = MetricDefinition(
    "rl_data_rank_filtered_samples",
    "counter",
    "Samples the task filtered out on purpose (e.g. RL prompts over the length limit)",
    RANK_TAGS,
)
RANK_ZERO_LOSS_SAMPLES = MetricDefinition(
    "rl_data_rank_zero_loss_samples",
    "counter",
    "Handed-out samples with loss_multiplier 0 (over length, cut to a stub: no training signal)",
    RANK_TAGS,
)
RANK_PREFETCH_DEPTH = MetricDefinition(
    "rl_data_rank_prefetch_depth", "gauge", "Batches produced and ready to hand out", RANK_TAGS
)
RANK_BLOCKED_SECONDS = MetricDefinition(
    "rl_data_rank_blocked_seconds",
    "counter",
    "Seconds next_batch waited for a batch to be produced",
    RANK_TAGS,
)
COORDINATOR_STEPS = MetricDefinition(
    "rl_data_coordinator_steps", "counter", "Steps handed out by next_step", COORDINATOR_TAGS
)
COORDINATOR_STEP_LATENCY = MetricDefinition(
    "rl_data_coordinator_step_latency_seconds",
    "histogram",
    "Wall time of next_step, in seconds",
    COORDINATOR_TAGS,
    STEP_LATENCY_BOUNDARIES_S,
)
COORDINATOR_RESTORES = MetricDefinition(
    "rl_data_coordinator_restores",
    "counter",
    "Checkpoint loads and dead ranks replaced and restored, by kind",
    RESTORE_TAGS,
)
COORDINATOR_COMMITTED_STEP = MetricDefinition(
    "rl_data_coordinator_committed_step",
    "gauge",
    "The last committed step (after a commit or a restore)",
    COORDINATOR_TAGS,
)
COORDINATOR_CHECKPOINT_SECONDS = MetricDefinition(
    "rl_data_coordinator_checkpoint_seconds",
    "histogram",
    "Wall time of taking a checkpoint (state_dict or save_checkpoint: every rank's state gathered), in seconds",
    COORDINATOR_TAGS,
    CHECKPOINT_SECONDS_BOUNDARIES_S,
)
COORDINATOR_CHECKPOINT_BYTES = MetricDefinition(
    "rl_data_coordinator_checkpoint_bytes",
    "gauge",
    "Size of the last checkpoint taken, pickled, in bytes",
    COORDINATOR_TAGS,
)

#: Every metric of the rank actors and the coordinator, in the order the reference lists them.
METRICS: tuple[MetricDefinition, ...] = (
    RANK_BATCHES,
    RANK_SAMPLES,
    RANK_NON_PAD_TOKENS,
    RANK_PACKING_EFFICIENCY,
    RANK_SKIPPED_SAMPLES,
    RANK_FILTERED_SAMPLES,
    RANK_ZERO_LOSS_SAMPLES,
    RANK_PREFETCH_DEPTH,
    RANK_BLOCKED_SECONDS,
    COORDINATOR_STEPS,
    COORDINATOR_STEP_LATENCY,
    COORDINATOR_RESTORES,
    COORDINATOR_COMMITTED_STEP,
    COORDINATOR_CHECKPOINT_SECONDS,
    COORDINATOR_CHECKPOINT_BYTES,
)


@functools.cache
def _created() -> dict[str, Any]:
    """Every metric of :data:`METRICS`, created on first use in this process."""
    return create_all(METRICS)


class RankMetrics:
    """Records the metrics of logical rank ``rank`` of the coordinator ``coordinator``."""

    def __init__(self, coordinator: str, rank: int) -> None:
        self._tags = {"coordinator": coordinator, "rank": str(rank)}
        self._skipped_seen = self._filtered_seen = 0

    def record_produced(self, *, skipped_samples: int, filtered_samples: int = 0, ready: int) -> None:
        """A batch was produced; ``skipped_samples`` and ``filtered_samples`` are the loader's running totals."""
        metrics = _created()
        if skipped_samples > self._skipped_seen:
            metrics[RANK_SKIPPED_SAMPLES.name].inc(skipped_samples - self._skipped_seen, self._tags)
            self._skipped_seen = skipped_samples
        if filtered_samples > self._filtered_seen:
            metrics[RANK_FILTERED_SAMPLES.name].inc(filtered_samples - self._filtered_seen, self._tags)
            self._filtered_seen = filtered_samples
        metrics[RANK_PREFETCH_DEPTH.name].set(ready, self._tags)

    def record_handed_out(self, stats: BatchStats, *, waited_s: float, ready: int) -> None:
        """``next_batch`` handed out a batch after waiting ``waited_s`` for it."""
        metrics = _created()
        metrics[RANK_BATCHES.name].inc(1, self._tags)
        if stats.samples:
            metrics[RANK_SAMPLES.name].inc(stats.samples, self._tags)
        if stats.non_pad_tokens:
            metrics[RANK_NON_PAD_TOKENS.name].inc(stats.non_pad_tokens, self._tags)
        if stats.zero_loss_samples:
            metrics[RANK_ZERO_LOSS_SAMPLES.name].inc(stats.zero_loss_samples, self._tags)
        if stats.packing_efficiency is not None:
            metrics[RANK_PACKING_EFFICIENCY.name].set(stats.packing_efficiency, self._tags)
        if waited_s > 0:
            metrics[RANK_BLOCKED_SECONDS.name].inc(waited_s, self._tags)
        metrics[RANK_PREFETCH_DEPTH.name].set(ready, self._tags)


class CoordinatorMetrics:
    """Records the metrics of the coordinator named ``coordinator``."""

    def __init__(self, coordinator: str) -> None:
        self._tags = {"coordinator": coordinator}

    def record_step(self, latency_s: float) -> None:
        """``next_step`` handed out a step after ``latency_s`` seconds."""
        metrics = _created()
        metrics[COORDINATOR_STEPS.name].inc(1, self._tags)
        metrics[COORDINATOR_STEP_LATENCY.name].observe(latency_s, self._tags)

    def record_committed(self, step: int) -> None:
        """``step`` is now the committed step (after a commit or a restore)."""
        _created()[COORDINATOR_COMMITTED_STEP.name].set(step, self._tags)

    def record_checkpoint(self, seconds: float, size_bytes: int) -> None:
        """A checkpoint of ``size_bytes`` (pickled) was taken in ``seconds``."""
        metrics = _created()
        metrics[COORDINATOR_CHECKPOINT_SECONDS.name].observe(seconds, self._tags)
        metrics[COORDINATOR_CHECKPOINT_BYTES.name].set(size_bytes, self._tags)

    def record_restore(self, kind: RestoreKind) -> None:
        """A checkpoint was loaded (into fresh ranks, or as a rewind) or a dead rank was replaced and restored."""
        _created()[COORDINATOR_RESTORES.name].inc(1, {**self._tags, "kind": kind})
