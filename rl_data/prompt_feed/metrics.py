"""Ray metrics of a prompt feed, declared as data (:data:`METRICS`) and created on first use.

Every series has the tag ``feed`` (the feed's ``RuntimeConfig.name``) and is exported as
``ray_<name>`` (counters with ``_total``). Rates (acks/s, ...) are
``rate(ray_rl_data_feed_acks_total[1m])`` in Prometheus/Grafana. The rank actors of a feed
record the rank metrics of :mod:`rl_data.distributed.metrics` with ``coordinator=<feed name>``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from rl_data.distributed.metrics import TAGS as RUNTIME_TAGS
from rl_data.distributed.metrics import CHECKPOINT_SECONDS_BOUNDARIES_S, MetricDefinition, RestoreKind, create_all

#: What each tag of the feed's metrics holds.
TAGS: dict[str, str] = {
    "feed": "the feed's `RuntimeConfig.name`",
    "reason": "the reason string the trainer gave to `drop`, or the schedule's skip reason (`retired`, "
    "`deferred`, `deprioritized`, `member_weight`, or a user schedule's)",
    "member": "the mixture member of the prompt (`\"\"` outside a mixture)",
    "kind": RUNTIME_TAGS["kind"],
}
FEED_TAGS = ("feed",)
DROP_TAGS = ("feed", "reason")
RESTORE_TAGS = ("feed", "kind")
SKIP_TAGS = ("feed", "reason", "member")
MEMBER_TAGS = ("feed", "member")

TAKEN = MetricDefinition(
    "rl_data_feed_taken", "counter", "Prompts handed out by take (re-hand-outs included)", FEED_TAGS
)
ACKS = MetricDefinition("rl_data_feed_acks", "counter", "Prompts acked (trained)", FEED_TAGS)
DROPS = MetricDefinition(
    "rl_data_feed_drops", "counter", "Prompts dropped (consumed without training), by reason", DROP_TAGS
)
RELEASES = MetricDefinition(
    "rl_data_feed_releases", "counter", "Prompts released (given back to be handed out again)", FEED_TAGS
)
RESTORES = MetricDefinition(
    "rl_data_feed_restores",
    "counter",
    "Checkpoint loads and dead ranks replaced and restored, by kind",
    RESTORE_TAGS,
)
OUTSTANDING = MetricDefinition(
    "rl_data_feed_outstanding", "gauge", "Prompts handed out and not resolved", FEED_TAGS
)
OLDEST_OUTSTANDING_AGE = MetricDefinition(
    "rl_data_feed_oldest_outstanding_age_seconds",
    "gauge",
    "Age of the oldest outstanding hand-out, in seconds (0 with none outstanding)",
    FEED_TAGS,
)
LOW_WATER_MARK_EPOCH = MetricDefinition(
    "rl_data_feed_low_water_mark_epoch",
    "gauge",
    "Epoch of the oldest unresolved uid (where a checkpoint replays from)",
    FEED_TAGS,
)
LOW_WATER_MARK_POSITION = MetricDefinition(
    "rl_data_feed_low_water_mark_position",
    "gauge",
    "Position of the oldest unresolved uid in its epoch",
    FEED_TAGS,
)
EPOCH = MetricDefinition("rl_data_feed_epoch", "gauge", "The epoch the feed reads", FEED_TAGS)
SKIPPED = MetricDefinition(
    "rl_data_feed_skipped",
    "counter",
    "Prompts the schedule or a member weight skipped (never handed out in their epoch), by reason and member",
    SKIP_TAGS,
)
OUTCOMES = MetricDefinition(
    "rl_data_feed_outcomes", "counter", "Outcomes received with acks and drops, by mixture member", MEMBER_TAGS
)
ZERO_SPREAD = MetricDefinition(
    "rl_data_feed_zero_spread_outcomes",
    "counter",
    "Outcomes whose samples all earned the same reward (no advantage), by mixture member",
    MEMBER_TAGS,
)
GENERATED = MetricDefinition(
    "rl_data_feed_generated_samples", "counter", "Samples generated, as the outcomes report them, by mixture member", MEMBER_TAGS
)
PASS_RATE = MetricDefinition(
    "rl_data_feed_member_pass_rate",
    "gauge",
    "Mean pass rate of the outcomes received so far, by mixture member",
    MEMBER_TAGS,
)
MEMBER_TAKEN = MetricDefinition(
    "rl_data_feed_member_taken",
    "counter",
    "Prompts of a mixture handed out for the first time in their epoch, by member",
    MEMBER_TAGS,
)
RETIRED = MetricDefinition(
    "rl_data_feed_retired_prompts", "gauge", "Prompts the schedule retired (never handed out again)", FEED_TAGS
)
DEFERRED = MetricDefinition(
    "rl_data_feed_deferred_prompts",
    "gauge",
    "Prompts the schedule defers (skipped for their next appearances)",
    FEED_TAGS,
)
CHECKPOINT_SECONDS = MetricDefinition(
    "rl_data_feed_checkpoint_seconds",
    "histogram",
    "Wall time of taking a checkpoint (state_dict or save_checkpoint), in seconds",
    FEED_TAGS,
    CHECKPOINT_SECONDS_BOUNDARIES_S,
)
CHECKPOINT_BYTES = MetricDefinition(
    "rl_data_feed_checkpoint_bytes",
    "gauge",
    "Size of the last checkpoint taken, pickled, in bytes",
    FEED_TAGS,
)

#: Every metric of a prompt feed, in the order the reference lists them.
METRICS: tuple[MetricDefinition, ...] = (
    TAKEN,
    ACKS,
    DROPS,
    RELEASES,
    RESTORES,
    OUTSTANDING,
    OLDEST_OUTSTANDING_AGE,
    LOW_WATER_MARK_EPOCH,
    LOW_WATER_MARK_POSITION,
    EPOCH,
    SKIPPED,
    OUTCOMES,
    ZERO_SPREAD,
    GENERATED,
    PASS_RATE,
    MEMBER_TAKEN,
    RETIRED,
    DEFERRED,
    CHECKPOINT_SECONDS,
    CHECKPOINT_BYTES,
)


@functools.cache
def _created() -> dict[str, Any]:
    """Every metric of :data:`METRICS`, created on first use in this process."""
    return create_all(METRICS)


class FeedMetrics:
    """Records the metrics of the prompt feed ``feed``."""

    def __init__(self, feed: str) -> None:
        self._tags = {"feed": feed}

    def record_taken(self, count: int) -> None:
        if count:
            _created()[TAKEN.name].inc(count, self._tags)

    def record_acked(self, count: int) -> None:
        if count:
            _created()[ACKS.name].inc(count, self._tags)

    def record_dropped(self, count: int, reason: str) -> None:
        if count:
            _created()[DROPS.name].inc(count, {**self._tags, "reason": reason})

    def record_released(self, count: int) -> None:
        if count:
            _created()[RELEASES.name].inc(count, self._tags)

    def record_curation(self, events: dict[tuple[str, ...], int], pass_rates: Callable[[], dict[str, float]]) -> None:
        """The curator's ``events`` since the last call (``("skipped", reason, member)`` and
        ``("taken" | "outcomes" | "zero_spread" | "generated", member)``) and, when outcomes came, the members'
        mean pass rates (``pass_rates()``)."""
        metrics = _created()
        counters = {"taken": MEMBER_TAKEN, "outcomes": OUTCOMES, "zero_spread": ZERO_SPREAD, "generated": GENERATED}
        for (kind, *labels), count in events.items():
            if not count:
                continue
            if kind == "skipped":
                metrics[SKIPPED.name].inc(count, {**self._tags, "reason": labels[0], "member": labels[1]})
            else:
                metrics[counters[kind].name].inc(count, {**self._tags, "member": labels[0]})
        if any(key[0] == "outcomes" for key in events):
            for member, rate in pass_rates().items():
                metrics[PASS_RATE.name].set(rate, {**self._tags, "member": member})

    def record_restore(self, kind: RestoreKind) -> None:
        _created()[RESTORES.name].inc(1, {**self._tags, "kind": kind})

    def record_checkpoint(self, seconds: float, size_bytes: int) -> None:
        """A checkpoint of ``size_bytes`` (pickled) was taken in ``seconds``."""
        metrics = _created()
        metrics[CHECKPOINT_SECONDS.name].observe(seconds, self._tags)
        metrics[CHECKPOINT_BYTES.name].set(size_bytes, self._tags)

    def record_levels(
        self, *, outstanding: int, oldest_age_s: float, low_water_mark: tuple[int, int], epoch: int, retired: int, deferred: int
    ) -> None:
        """The gauges (after every call, and every second for the age)."""
        metrics = _created()
        metrics[RETIRED.name].set(retired, self._tags)
        metrics[DEFERRED.name].set(deferred, self._tags)
        metrics[OUTSTANDING.name].set(outstanding, self._tags)
        metrics[OLDEST_OUTSTANDING_AGE.name].set(oldest_age_s, self._tags)
        metrics[LOW_WATER_MARK_EPOCH.name].set(low_water_mark[0], self._tags)
        metrics[LOW_WATER_MARK_POSITION.name].set(low_water_mark[1], self._tags)
        metrics[EPOCH.name].set(epoch, self._tags)
