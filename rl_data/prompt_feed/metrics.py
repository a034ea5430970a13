"""Ray metrics of a prompt feed (``ray.util.metrics``, exported as ``ray_<name>``, counters ``_total``).

Every series has the tag ``feed`` (the feed's ``RuntimeConfig.name``):

* counters ``rl_data_feed_taken`` (prompts handed out, re-hand-outs included),
  ``rl_data_feed_acks``, ``rl_data_feed_drops`` (also tagged ``reason``), ``rl_data_feed_releases``,
  ``rl_data_feed_restores`` (tag ``kind``: ``checkpoint`` into a fresh feed, ``rewind`` of a
  live feed, or ``rank_recovery``);
* gauges ``rl_data_feed_outstanding`` (prompts handed out and unresolved),
  ``rl_data_feed_oldest_outstanding_age_seconds`` (0 with none outstanding),
  ``rl_data_feed_low_water_mark_epoch`` and ``rl_data_feed_low_water_mark_position`` (the oldest
  unresolved uid: where a checkpoint replays from), ``rl_data_feed_epoch`` (the epoch being read).

Rates (acks/s, ...) are ``rate(ray_rl_data_feed_acks_total[1m])`` in Prometheus/Grafana. The
rank actors of a feed record the rank metrics of :mod:`rl_data.distributed.metrics` with
``coordinator=<feed name>``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

FEED_TAGS = ("feed",)
DROP_TAGS = ("feed", "reason")
RESTORE_TAGS = ("feed", "kind")


@dataclass(frozen=True)
class _Definitions:
    taken: Any
    acks: Any
    drops: Any
    releases: Any
    restores: Any
    outstanding: Any
    oldest_age: Any
    low_water_mark_epoch: Any
    low_water_mark_position: Any
    epoch: Any


@functools.cache
def _definitions() -> _Definitions:
    from ray.util.metrics import Counter, Gauge

    return _Definitions(
        taken=Counter("rl_data_feed_taken", "Prompts handed out by take (re-hand-outs included)", FEED_TAGS),
        acks=Counter("rl_data_feed_acks", "Prompts acked (trained)", FEED_TAGS),
        drops=Counter("rl_data_feed_drops", "Prompts dropped (consumed without training), by reason", DROP_TAGS),
        releases=Counter("rl_data_feed_releases", "Prompts released (given back to be handed out again)", FEED_TAGS),
        restores=Counter("rl_data_feed_restores", "Checkpoint loads and rank recoveries", RESTORE_TAGS),
        outstanding=Gauge("rl_data_feed_outstanding", "Prompts handed out and not resolved", FEED_TAGS),
        oldest_age=Gauge(
            "rl_data_feed_oldest_outstanding_age_seconds", "Age of the oldest outstanding hand-out", FEED_TAGS
        ),
        low_water_mark_epoch=Gauge("rl_data_feed_low_water_mark_epoch", "Epoch of the oldest unresolved uid", FEED_TAGS),
        low_water_mark_position=Gauge(
            "rl_data_feed_low_water_mark_position", "Position of the oldest unresolved uid in its epoch", FEED_TAGS
        ),
        epoch=Gauge("rl_data_feed_epoch", "The epoch the feed reads", FEED_TAGS),
    )


class FeedMetrics:
    """Records the metrics of the prompt feed ``feed``."""

    def __init__(self, feed: str) -> None:
        self._tags = {"feed": feed}

    def record_taken(self, count: int) -> None:
        if count:
            _definitions().taken.inc(count, self._tags)

    def record_acked(self, count: int) -> None:
        if count:
            _definitions().acks.inc(count, self._tags)

    def record_dropped(self, count: int, reason: str) -> None:
        if count:
            _definitions().drops.inc(count, {**self._tags, "reason": reason})

    def record_released(self, count: int) -> None:
        if count:
            _definitions().releases.inc(count, self._tags)

    def record_restore(self, kind: Literal["checkpoint", "rewind", "rank_recovery"]) -> None:
        _definitions().restores.inc(1, {**self._tags, "kind": kind})

    def record_levels(
        self, *, outstanding: int, oldest_age_s: float, low_water_mark: tuple[int, int], epoch: int
    ) -> None:
        """The gauges (after every call, and every second for the age)."""
        metrics = _definitions()
        metrics.outstanding.set(outstanding, self._tags)
        metrics.oldest_age.set(oldest_age_s, self._tags)
        metrics.low_water_mark_epoch.set(low_water_mark[0], self._tags)
        metrics.low_water_mark_position.set(low_water_mark[1], self._tags)
        metrics.epoch.set(epoch, self._tags)
