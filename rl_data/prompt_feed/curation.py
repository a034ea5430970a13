"""``Curator``: what the prompt ledger hands out, from outcomes, a schedule and member weights (pure).

The ledger (:mod:`rl_data.prompt_feed.ledger`) keeps exactly-once books; the curator decides, for
every prompt the stream reaches that was never handed out, whether to hand it out or skip it and
why (:meth:`Curator.decide`), and keeps what those decisions read: the prompts' history
(:class:`~rl_data.prompt_feed.outcomes.PromptHistory`), per mixture member counts, and the member
weight changes. Its state (:meth:`Curator.state`) is part of the ledger's checkpoint.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rl_data.prompt_feed.merge import Item, Uid
from rl_data.prompt_feed.outcomes import Outcome, PromptHistory
from rl_data.prompt_feed.schedules import Decision, ScheduleConfig, draw

#: The skip reason of a prompt thinned out by its mixture member's weight.
MEMBER_WEIGHT = "member_weight"
#: The state's keys (the ledger's checkpoint holds them beside its own).
KEY_SCHEDULE, KEY_HISTORY, KEY_MEMBERS, KEY_WEIGHTS = "schedule", "history", "members", "member_weights"
STATE_KEYS = (KEY_SCHEDULE, KEY_HISTORY, KEY_MEMBERS, KEY_WEIGHTS)


def add(counts: dict[str, int], reason: str, n: int = 1) -> None:
    counts[reason] = counts.get(reason, 0) + n


@dataclass(slots=True)
class MemberCounts:
    """One mixture member's accounting: prompts handed out, skipped per reason, outcomes and their pass rates."""

    taken: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    outcomes: int = 0
    pass_rate_sum: float = 0.0
    generated: int = 0
    zero_spread: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"taken": self.taken, "skipped": dict(self.skipped), "outcomes": self.outcomes,
                "pass_rate_sum": self.pass_rate_sum, "generated": self.generated, "zero_spread": self.zero_spread}  # fmt: skip

    def summary(self) -> dict[str, Any]:
        """The counters with the mean pass rate and the samples generated per group with a reward spread."""
        useful = self.outcomes - self.zero_spread
        return {
            **self.to_json(),
            "pass_rate": self.pass_rate_sum / self.outcomes if self.outcomes else None,
            "generated_per_useful_group": self.generated / useful if useful else None,
        }


def member_name(item: Item) -> str | None:
    """The mixture member of a prompt (its ``source_datasets`` column), None outside a mixture."""
    payload = item.payload
    name = payload.get("source_datasets") if isinstance(payload, dict) else None
    return name if isinstance(name, str) else None


class Curator:
    """Decisions, history, member counts and weights of one ledger (see the module doc)."""

    def __init__(self, schedule: ScheduleConfig, weight_shares: Callable[[dict[str, float]], dict[str, float]] | None) -> None:
        self.schedule = schedule
        self._schedule = schedule.build()
        if schedule.reweight_every and weight_shares is None:
            raise ValueError(
                f"schedule {schedule.name!r} has reweight_every {schedule.reweight_every}, which needs a feed over a "
                "mixture of datasets; set reweight_every 0"
            )
        self._weight_shares = weight_shares
        self.history = PromptHistory()
        self.members: dict[str, MemberCounts] = {}
        self.weights: list[tuple[Uid, dict[str, float]]] = []  # (from uid, member -> hand-out share), by uid
        self.events: Counter = Counter()  # for metrics, since the last pop (not checkpointed)
        self._reweighed_at: Uid | None = None

    def decide(self, uid: Uid, item: Item, frontier: Uid) -> str | None:
        """The skip reason of a prompt reached for the first time, None to hand it out."""
        seed, every = self.schedule.seed, self.schedule.reweight_every
        if every and uid.position % every == 0 and uid.position and self._reweighed_at != uid:
            weights = self._schedule.member_weights({name: c.summary() for name, c in sorted(self.members.items())})
            if weights is not None:
                self.add_weights(self._weight_shares(weights), uid, frontier)
            self._reweighed_at = uid  # a decision retried after it raised does not ask again
        shares = self._shares_at(uid)
        name = member_name(item)
        if shares and name is not None and draw(seed, uid.epoch, uid.position, "member\x1f" + item.key) >= shares.get(name, 1.0):
            return MEMBER_WEIGHT
        history = self.history
        retired_share = history.retired / len(history) if len(history) else 0.0
        decision = self._schedule.decide(history.get(item.key), draw(seed, uid.epoch, uid.position, item.key), retired_share=retired_share)
        if not isinstance(decision, Decision):
            raise TypeError(f"schedule {self.schedule.name!r} returned {decision!r} from decide, expected a Decision")
        if decision.record is not None:
            history.put(item.key, decision.record)
        return decision.skip

    def add_weights(self, shares: dict[str, float], start: Uid, frontier: Uid) -> None:
        """Member shares from ``start`` on; the changes before ``frontier`` (decided for good) are
        pruned but the one in effect there."""
        bad = {m: v for m, v in shares.items() if not isinstance(m, str) or not isinstance(v, (int, float)) or not 0 <= v <= 1}
        if bad:
            raise ValueError(f"member shares must map member names to numbers in [0, 1], found {bad!r}")
        changes = sorted([*self.weights, (start, {m: float(v) for m, v in sorted(shares.items())})], key=lambda c: c[0])
        settled = [c for c in changes if c[0] <= frontier]
        self.weights = settled[-1:] + [c for c in changes if c[0] > frontier]

    def skipped(self, item: Item, reason: str) -> None:
        name = member_name(item)
        self.events["skipped", reason, name or ""] += 1
        if name is not None:
            add(self._member(name).skipped, reason)

    def handed_out(self, item: Item) -> None:
        name = member_name(item)
        if name is not None:
            self.events["taken", name] += 1
            self._member(name).taken += 1

    def observe(self, item: Item, outcome: Outcome) -> None:
        self.history.observe(item.key, outcome)
        name = member_name(item)
        self.events["outcomes", name or ""] += 1
        self.events["zero_spread", name or ""] += int(outcome.zero_spread)
        self.events["generated", name or ""] += outcome.samples
        if name is not None:
            member = self._member(name)
            member.outcomes += 1
            member.pass_rate_sum += outcome.pass_rate
            member.generated += outcome.samples
            member.zero_spread += int(outcome.zero_spread)

    def used(self) -> bool:
        """Whether anything beyond a uniform schedule without outcomes or weights was used."""
        return self.schedule.describe() != ScheduleConfig().describe() or bool(len(self.history) or self.members or self.weights)

    def summary(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule.describe(),
            "history": {
                "prompts": len(self.history), "bytes": self.history.nbytes,
                "retired": self.history.retired, "deferred": self.history.deferred,
            },
            "members": {name: c.summary() for name, c in sorted(self.members.items())},
            "member_weights": [[*uid, dict(shares)] for uid, shares in self.weights],
        }

    def state(self) -> dict[str, Any]:
        return {
            KEY_SCHEDULE: self.schedule.describe(),
            KEY_HISTORY: self.history.state() if len(self.history) else None,  # b"" does not load with weights_only
            KEY_MEMBERS: {name: c.to_json() for name, c in sorted(self.members.items())},
            KEY_WEIGHTS: [[*uid, dict(shares)] for uid, shares in self.weights],
        }

    def checked_state(self, state: dict[str, Any] | None, uid: Callable[[Any], Uid]) -> tuple[PromptHistory, dict, list]:
        """History, members and weights of ``state`` (None: a checkpoint saved before any was used);
        ``ValueError`` for another schedule or a malformed state. Changes nothing."""
        saved = state[KEY_SCHEDULE] if state is not None else ScheduleConfig().describe()
        if saved != self.schedule.describe():
            raise ValueError(
                f"prompt ledger checkpoint was saved with another schedule: in checkpoint: {saved!r} / in this "
                f"feed: {self.schedule.describe()!r}; restore with the schedule it was saved with (FeedConfig.schedule)"
            )
        if state is None:
            return PromptHistory(), {}, []
        history = PromptHistory() if state[KEY_HISTORY] is None else PromptHistory.from_state(state[KEY_HISTORY])
        try:
            members = {str(name): MemberCounts(**counts) for name, counts in state[KEY_MEMBERS].items()}
            weights = [(uid([epoch, position]), dict(shares)) for epoch, position, shares in state[KEY_WEIGHTS]]
        except (TypeError, ValueError, AttributeError):
            raise ValueError(
                "prompt ledger checkpoint holds malformed member counts or member weights; it was not saved by "
                "this rl_data version"
            ) from None
        return history, members, weights

    def load(self, checked: tuple[PromptHistory, dict, list]) -> None:
        self.history, self.members, self.weights = checked

    def pop_events(self) -> Counter:
        events, self.events = self.events, Counter()
        return events

    def member_pass_rates(self) -> dict[str, float]:
        return {name: c.pass_rate_sum / c.outcomes for name, c in self.members.items() if c.outcomes}

    def _shares_at(self, uid: Uid) -> dict[str, float] | None:
        """The member shares in effect at ``uid`` (None: no weights set)."""
        shares = None
        for start, value in self.weights:
            if start > uid:
                break
            shares = value
        return shares

    def _member(self, name: str) -> MemberCounts:
        return self.members.setdefault(name, MemberCounts())
