"""Prometheus alert rules for rl_data, built from the metric definitions: :func:`alert_rules`.

One rule group, ``rl_data``; every alert has a ``for`` duration, a ``severity`` label and a summary
and description (Prometheus templates over the alert's labels and value).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rl_data.distributed import metrics as runtime
from rl_data.monitoring.promql import check_expression, select
from rl_data.prompt_feed import metrics as feeds

GROUP = "rl_data"
#: A rank keeps the trainer waiting more than this share of the time (over :data:`BLOCKED_WINDOW`).
BLOCKED_SHARE = 0.5
BLOCKED_WINDOW = "10m"
#: An outstanding prompt older than this, in seconds.
OUTSTANDING_AGE_S = 600
#: More dead ranks replaced than this within :data:`RECOVERY_WINDOW`.
RANK_RECOVERIES = 3
RECOVERY_WINDOW = "15m"


@dataclass(frozen=True)
class Alert:
    """One alerting rule."""

    name: str
    expr: str
    duration: str
    severity: str
    summary: str
    description: str

    def rule(self) -> dict[str, Any]:
        """The rule as Prometheus reads it."""
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.duration,
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": self.description},
        }


def alert_rules() -> dict[str, Any]:
    """The Prometheus rules file (``groups:``); refuses an alert over an undefined series or label."""
    rules = []
    for alert in alerts():
        check_expression(alert.expr)
        rules.append(alert.rule())
    return {"groups": [{"name": GROUP, "rules": rules}]}


def alerts() -> tuple[Alert, ...]:
    blocked = f"rate({select(runtime.RANK_BLOCKED_SECONDS)}[{BLOCKED_WINDOW}])"
    steps = f"rate({select(runtime.COORDINATOR_STEPS)}[10m])"
    drops, acks = f"rate({select(feeds.DROPS)}[15m])", f"rate({select(feeds.ACKS)}[15m])"
    rank_recovery = '="rank_recovery"'
    return (
        Alert(
            "RlDataRankBlocksTrainer",
            f"sum by (coordinator, rank) ({blocked}) > {BLOCKED_SHARE}",
            "5m",
            "warning",
            "Rank {{ $labels.rank }} of {{ $labels.coordinator }} keeps the trainer waiting "
            "{{ $value | humanizePercentage }} of the time",
            f"next_batch waited for a batch more than {BLOCKED_SHARE:.0%} of the time over {BLOCKED_WINDOW}: the "
            "data is the bottleneck. Give each rank more CPUs and Energon workers, add logical shards, or "
            "turn on warm workers.",
        ),
        Alert(
            "RlDataPrefetchEmpty",
            f"max by (coordinator, rank) (max_over_time({select(runtime.RANK_PREFETCH_DEPTH)}[10m])) == 0 "
            f"and on (coordinator) sum by (coordinator) ({steps}) > 0",
            "5m",
            "info",
            "Rank {{ $labels.rank }} of {{ $labels.coordinator }} had no batch ready for 10 minutes while steps ran",
            "The rank's prefetch queue stayed empty: every batch is produced while the trainer waits. "
            "See RlDataRankBlocksTrainer for how much it costs.",
        ),
        Alert(
            "RlDataRankRecoveries",
            f"sum by (coordinator) (increase({select(runtime.COORDINATOR_RESTORES, kind=rank_recovery)}"
            f"[{RECOVERY_WINDOW}])) > {RANK_RECOVERIES}",
            "1m",
            "critical",
            "{{ $labels.coordinator }} replaced " + f"more than {RANK_RECOVERIES} dead ranks in {RECOVERY_WINDOW}",
            "Rank actors die and are replaced; their logs say why. Each rank is replaced at most "
            "RuntimeConfig.max_rank_restarts times, then the job fails.",
        ),
        Alert(
            "RlDataFeedRankRecoveries",
            f"sum by (feed) (increase({select(feeds.RESTORES, kind=rank_recovery)}[{RECOVERY_WINDOW}])) "
            f"> {RANK_RECOVERIES}",
            "1m",
            "critical",
            "Prompt feed {{ $labels.feed }} replaced " + f"more than {RANK_RECOVERIES} dead ranks in {RECOVERY_WINDOW}",
            "The feed's rank actors die and are replaced; their logs say why. Each rank is replaced at most "
            "RuntimeConfig.max_rank_restarts times, then the feed fails.",
        ),
        Alert(
            "RlDataPromptOutstandingTooLong",
            f"max by (feed) ({select(feeds.OLDEST_OUTSTANDING_AGE)}) > {OUTSTANDING_AGE_S}",
            "5m",
            "warning",
            "Prompt feed {{ $labels.feed }} has a prompt outstanding for {{ $value | humanizeDuration }}",
            f"A prompt was handed out more than {OUTSTANDING_AGE_S // 60} minutes ago and is neither acked, "
            "dropped nor released: a rollout worker took it and never resolved it. release_holder gives a "
            "dead holder's prompts back.",
        ),
        Alert(
            "RlDataFeedDropsDominate",
            f"sum by (feed) ({drops}) > (sum by (feed) ({acks}) or sum by (feed) ({drops}) * 0)",
            "15m",
            "warning",
            "Prompt feed {{ $labels.feed }} drops more prompts than it trains",
            "Over 15 minutes, more prompts were dropped (consumed without training) than acked. The drop "
            "reasons are on the dashboard's Drops/s by reason panel.",
        ),
    )
