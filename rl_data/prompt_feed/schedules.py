"""Schedules: which prompts the feed hands out, decided from their history (pure: no Ray, no I/O).

The feed asks its schedule once for every prompt it reaches in its stream that was never handed out
(``decide``): hand it out, or skip it for a reason (counted per reason and per epoch, recorded in
the checkpoint, never handed out in that epoch). A decision is a function of the prompt's
:class:`~rl_data.prompt_feed.outcomes.PromptRecord` and ``draw``, a number in [0, 1) that depends
only on the schedule's seed, the prompt's uid and its key: the same history and seed give the same
hand-outs, and a restore repeats them. A schedule may update the record it decided on (a deferral
counting down); outcomes update it through ``PromptRecord.after``.

Built in (:data:`SCHEDULES`):

* ``uniform``: every prompt, every epoch (the default).
* ``difficulty_filter``: retire a prompt solved in its last ``retire_after`` tries (all samples
  right), at most ``max_retired_share`` of the prompts with a history; skip a prompt failed in its
  last ``defer_after`` tries (no sample right) for its next ``defer_for`` appearances (epochs, over
  exact passes), then give it another try; each further failed run of ``defer_after`` tries in a
  row defers it ``defer_for`` appearances longer, up to ``max_defer``.
* ``prioritized``: hand a prompt out with probability ``max(floor, w(p))``, ``p`` its pass rate and
  ``w`` ``4p(1-p)`` (``"variance"``: most for prompts solved half the time) or ``1-p``
  (``"failure"``); prompts without a history always.

A user schedule is a class named by import path (``"package.module:Class"``) whose constructor takes
the options as keywords and that has ``decide(record, draw) -> Decision``. Over a mixture, it may
also have ``member_weights(members) -> dict | None``: every ``reweight_every`` stream positions the
feed passes it each member's counters (``taken``, ``skipped``, ``outcomes``, ``pass_rate``, ...) and
applies the weights it returns from that uid on (None: no change).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any, Literal, Optional, Protocol

from pydantic import BaseModel, ConfigDict, Field

from rl_data.import_path import load_object
from rl_data.prompt_feed.outcomes import PromptRecord

RETIRED, DEFERRED, DEPRIORITIZED = "retired", "deferred", "deprioritized"


@dataclass(frozen=True, slots=True)
class Decision:
    """Hand the prompt out (``skip`` None) or skip it for ``skip``; ``record``: its new history, if changed."""

    skip: Optional[str] = None
    record: Optional[PromptRecord] = None


HAND_OUT = Decision()


class Schedule(Protocol):
    def decide(self, record: Optional[PromptRecord], draw: float, *, retired_share: float) -> Decision:
        """``record``: the prompt's history (None: it never had an outcome); ``retired_share``: the
        share of prompts with a history that are retired."""


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Uniform(_Options):
    """Every prompt, every epoch."""

    def decide(self, record: Optional[PromptRecord], draw: float, *, retired_share: float) -> Decision:
        return HAND_OUT


class DifficultyFilter(_Options):
    """Retire prompts solved in their last tries, defer prompts failed in their last tries."""

    retire_after: int = Field(default=2, ge=1, le=127, description="Solved tries in a row that retire a prompt.")
    max_retired_share: float = Field(default=0.5, ge=0, le=1, description="Retire no more than this share of the prompts with a history.")
    defer_after: int = Field(default=2, ge=1, le=127, description="Failed tries in a row that defer a prompt.")
    defer_for: int = Field(default=2, ge=1, le=255, description="Appearances (epochs) a prompt is skipped when first deferred.")
    max_defer: int = Field(default=8, ge=1, le=255, description="Appearances a prompt is skipped at most at once.")

    def decide(self, record: Optional[PromptRecord], draw: float, *, retired_share: float) -> Decision:
        if record is None:
            return HAND_OUT
        if record.retired:
            return Decision(RETIRED)
        if record.skip_left:
            return Decision(DEFERRED, replace(record, skip_left=record.skip_left - 1))
        if record.streak >= self.retire_after and retired_share < self.max_retired_share:
            return Decision(RETIRED, replace(record, retired=True))
        if record.streak <= -self.defer_after and not record.deferred:
            runs = -record.streak // self.defer_after  # failed runs of defer_after tries in a row
            skip = min(self.defer_for * runs, self.max_defer, 255)
            return Decision(DEFERRED, replace(record, skip_left=skip - 1, deferred=True))
        return HAND_OUT


class Prioritized(_Options):
    """Hand out a prompt with probability ``max(floor, w(pass rate))``."""

    weight: Literal["variance", "failure"] = Field(default="variance", description="w(p): 'variance' 4p(1-p), 'failure' 1-p.")
    floor: float = Field(default=0.1, gt=0, le=1, description="The lowest hand-out probability: no prompt starves.")

    def decide(self, record: Optional[PromptRecord], draw: float, *, retired_share: float) -> Decision:
        if record is None or record.tries == 0:
            return HAND_OUT
        p = record.pass_rate
        weight = 4 * p * (1 - p) if self.weight == "variance" else 1 - p
        return HAND_OUT if draw < max(self.floor, weight) else Decision(DEPRIORITIZED)


SCHEDULES: dict[str, type] = {"uniform": Uniform, "difficulty_filter": DifficultyFilter, "prioritized": Prioritized}


class WeightChange(BaseModel):
    """New mixture member weights from uid ``at`` (``[epoch, position]``) on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: tuple[int, int] = Field(description="The first uid the weights apply to, [epoch, position].")
    weights: dict[str, float] = Field(description="Member name -> weight, relative, as in the mixture; members not named keep theirs.")


class ScheduleConfig(BaseModel):
    """Which schedule a feed runs (a built-in name or ``"package.module:Class"``, its options and
    seed) and, over a mixture, the member weights it changes to at given uids."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="uniform", description="'uniform', 'difficulty_filter', 'prioritized' or 'package.module:Class'.")
    options: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the schedule.")
    seed: int = Field(default=0, ge=0, description="Seed of the schedule's draws.")
    member_weights: list[WeightChange] = Field(
        default_factory=list, description="Over a mixture: member weights from given uids on (a schedule over the stream)."
    )
    reweight_every: int = Field(
        default=0, ge=0, description="Over a mixture: every this many stream positions, new member weights from the schedule's member_weights(members) (0: never)."
    )

    def build(self) -> Schedule:
        """The schedule; ``ValueError`` naming the schedule for an unknown name or bad options."""
        cls = SCHEDULES.get(self.name)
        if cls is None:
            if ":" not in self.name:
                raise ValueError(
                    f"schedule {self.name!r} is not built in ({', '.join(SCHEDULES)}) nor an import path "
                    "'package.module:Class'; name one of them"
                )
            cls = load_object(self.name, "schedule", hint="a schedule is a class with decide(record, draw, *, retired_share)")
        try:
            schedule = cls(**self.options)
        except (TypeError, ValueError) as error:
            raise ValueError(f"schedule {self.name!r} refuses options {self.options!r}: {error}") from None
        if not callable(getattr(schedule, "decide", None)):
            raise ValueError(f"schedule {self.name!r} has no decide(record, draw, *, retired_share) method")
        if self.reweight_every and not callable(getattr(schedule, "member_weights", None)):
            raise ValueError(
                f"schedule {self.name!r} has reweight_every {self.reweight_every} but no member_weights(members) method; "
                "add one, or set reweight_every 0"
            )
        return schedule

    def describe(self) -> dict[str, Any]:
        """What a checkpoint records of it (a restore refuses another)."""
        described = {"name": self.name, "options": dict(sorted(self.options.items())), "seed": self.seed}
        if self.member_weights:
            described["member_weights"] = [[*change.at, dict(sorted(change.weights.items()))] for change in self.member_weights]
        if self.reweight_every:
            described["reweight_every"] = self.reweight_every
        return described


def draw(seed: int, epoch: int, position: int, key: str) -> float:
    """The schedule's number in [0, 1) for the prompt ``key`` at uid ``(epoch, position)``."""
    digest = hashlib.blake2b(f"{seed}\x1f{epoch}\x1f{position}\x1f{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64
