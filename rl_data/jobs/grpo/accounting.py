"""Accounting of the GRPO demo: what the trainer resolved, checked against the data and the feed.

:class:`TrainingRecord` is the trainer's own record, in order, of every prompt it resolved:
trained in step k, or dropped with a reason. It is saved with every checkpoint and rolled back
with the model when a run restores one (steps after the checkpoint are trained again, so they
are not duplicates). :func:`epoch_accounts` checks it three ways, per finished epoch:

1. against the **data**: the prompt keys of one pass over the dataset (every prompt once);
2. against itself: no uid and no prompt key resolved twice in an epoch (**duplicates**), no
   prompt of the pass left unresolved (**missing**) but those the feed's schedule skipped: the
   unresolved keys must be exactly the skipped ones (their count and ``keys_digest`` equal the
   feed's ``skipped`` and ``skipped_digest``), else every unresolved prompt counts as missing;
3. against the **feed**: its per-epoch ``acked``/``dropped`` counts equal the record's.

A mixture source has no passes: it is one endless epoch 0, checked by :func:`stream_account`
over its first N positions against the producers' merged stream.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rl_data.prompt_feed.outcomes import keys_digest

TRAINED = "trained"


@dataclass(frozen=True)
class Resolution:
    """One prompt the trainer resolved: ``outcome`` is :data:`TRAINED` or a drop reason."""

    uid: tuple[int, int]
    key: str
    outcome: str
    step: int


@dataclass
class TrainingRecord:
    """The trainer's resolutions in order; ``to_json``/``from_json`` for checkpoints."""

    resolutions: list[Resolution] = field(default_factory=list)

    def add(self, uid: Iterable[int], key: str, outcome: str, step: int) -> None:
        self.resolutions.append(Resolution(tuple(uid), key, outcome, step))

    def to_json(self) -> list[list[Any]]:
        return [[list(r.uid), r.key, r.outcome, r.step] for r in self.resolutions]

    @classmethod
    def from_json(cls, rows: list[list[Any]]) -> "TrainingRecord":
        return cls([Resolution(tuple(uid), key, outcome, step) for uid, key, outcome, step in rows])

    def copy(self) -> "TrainingRecord":
        return TrainingRecord(list(self.resolutions))


@dataclass(frozen=True)
class EpochAccount:
    """One epoch's three-way accounting."""

    epoch: int
    expected: int
    trained: int
    dropped: dict[str, int]
    skipped: dict[str, int]  # by the feed's schedule, per reason
    duplicates: int
    missing: int
    unexpected: int
    feed_agrees: bool

    @property
    def exactly_once(self) -> bool:
        return self.duplicates == 0 and self.missing == 0 and self.unexpected == 0 and self.feed_agrees


def epoch_accounts(
    record: TrainingRecord, expected_keys: Iterable[str], feed_epochs: Iterable[Mapping[str, Any]], epochs: int
) -> list[EpochAccount]:
    """The accounting of epochs ``0 .. epochs-1`` (see the module doc).

    ``feed_epochs`` is ``PromptFeed.status()["epochs"]``.
    """
    expected = set(expected_keys)
    feed = {e["epoch"]: e for e in feed_epochs}
    accounts = []
    for epoch in range(epochs):
        mine = [r for r in record.resolutions if r.uid[0] == epoch]
        uids, keys = Counter(r.uid for r in mine), Counter(r.key for r in mine)
        outcomes = Counter(r.outcome for r in mine)
        trained = outcomes.pop(TRAINED, 0)
        duplicates = sum(n - 1 for n in uids.values()) + sum(n - 1 for n in keys.values())
        seen = feed.get(epoch, {})
        unresolved, skipped = expected - set(keys), seen.get("skipped", {})
        skipped_exactly = len(unresolved) == sum(skipped.values()) and keys_digest(unresolved) == seen.get("skipped_digest", 0)
        accounts.append(EpochAccount(
            epoch=epoch,
            expected=len(expected),
            trained=trained,
            dropped=dict(sorted(outcomes.items())),
            skipped=dict(sorted(skipped.items())),
            duplicates=duplicates,
            missing=0 if skipped_exactly else len(unresolved),
            unexpected=len(set(keys) - expected),
            feed_agrees=(
                seen.get("acked") == trained and seen.get("dropped", {}) == dict(outcomes)
                and seen.get("size") == len(expected) and seen.get("resolved_exactly_once") is True
            ),
        ))  # fmt: skip
    return accounts


def stream_account(
    record: TrainingRecord, expected_keys: list[str], feed_epochs: Iterable[Mapping[str, Any]]
) -> EpochAccount:
    """The accounting of the first ``len(expected_keys)`` prompts of one endless epoch 0 (a
    mixture source has no passes): position p must be resolved exactly once, with key
    ``expected_keys[p]`` (the merged stream of the producers' loaders, read directly)."""
    feed = {e["epoch"]: e for e in feed_epochs}.get(0, {})
    mine = [r for r in record.resolutions if r.uid[0] == 0]
    positions = Counter(r.uid[1] for r in mine)
    outcomes = Counter(r.outcome for r in mine)
    trained = outcomes.pop(TRAINED, 0)
    wanted = range(len(expected_keys))
    return EpochAccount(
        epoch=0,
        expected=len(expected_keys),
        trained=trained,
        dropped=dict(sorted(outcomes.items())),
        skipped={},
        duplicates=sum(n - 1 for n in positions.values()),
        missing=sum(1 for p in wanted if p not in positions),
        unexpected=sum(1 for r in mine if r.uid[1] < len(expected_keys) and r.key != expected_keys[r.uid[1]]),
        feed_agrees=feed.get("acked") == trained and feed.get("dropped", {}) == dict(outcomes),
    )
