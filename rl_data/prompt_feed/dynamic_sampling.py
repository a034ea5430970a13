"""``DynamicSampler``: batches of groups with a reward spread, DAPO's dynamic sampling over the prompt feed.

A GRPO group whose samples all earned the same reward has zero advantage: it teaches nothing. The
sampler takes prompts from the feed, has the caller's ``generate`` roll them out, **drops** each
group without spread at once (``drop(uid, reason, outcome)``: counted under ``reason``, its outcome
kept for the feed's schedule) and takes more prompts until ``groups`` useful groups are there.
Useful groups beyond the batch wait for the next one (their prompts stay outstanding). After the
training step, :meth:`DynamicSampler.ack` acks the batch's prompts with their outcomes.

``totals`` counts what it cost: prompts taken, groups kept and dropped, samples generated in all
and on dropped groups (``wasted_samples``), and ``samples_per_useful_group``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rl_data.prompt_feed.outcomes import Outcome

#: The drop reason of a group without reward spread.
ZERO_SPREAD = "zero_spread"


@dataclass
class SampledBatch:
    """``groups`` useful groups: the prompts, what ``generate`` returned for each and their outcomes."""

    prompts: list[Any]
    groups: list[Any]
    outcomes: list[Outcome]

    @property
    def uids(self) -> list[Any]:
        return [prompt.uid for prompt in self.prompts]


@dataclass
class SamplerTotals:
    taken: int = 0
    kept: int = 0
    dropped: int = 0
    samples: int = 0
    wasted_samples: int = 0
    takes: int = 0
    per_batch_extra_groups: list[int] = field(default_factory=list)

    @property
    def samples_per_useful_group(self) -> float | None:
        return self.samples / self.kept if self.kept else None


class DynamicSampler:
    """Fills batches with groups that have a reward spread (see the module doc).

    ``rollout`` and ``trainer``: the feed's clients (``attach_feed``); ``generate(prompts)`` returns
    one ``(group, Outcome)`` per prompt, in order. ``oversample``: prompts taken per missing group
    (> 1 takes ahead for the groups that will be dropped). ``max_takes``: takes per batch before it
    gives up (the window full, or every prompt without spread).
    """

    def __init__(
        self,
        rollout: Any,
        trainer: Any,
        generate: Callable[[list[Any]], Sequence[tuple[Any, Outcome]]],
        *,
        oversample: float = 1.0,
        reason: str = ZERO_SPREAD,
        max_takes: int = 1000,
    ) -> None:
        if oversample < 1:
            raise ValueError(f"oversample must be >= 1 (prompts taken per missing group), found {oversample!r}")
        self.rollout, self.trainer, self.generate = rollout, trainer, generate
        self.oversample, self.reason, self.max_takes = oversample, reason, max_takes
        self.totals = SamplerTotals()
        self._ready: list[tuple[Any, Any, Outcome]] = []  # useful groups not yet in a batch

    def next_batch(self, groups: int) -> SampledBatch:
        """``groups`` useful groups (taking, generating and dropping as needed)."""
        if type(groups) is not int or groups < 1:
            raise ValueError(f"next_batch needs groups >= 1, found {groups!r}")
        extra = 0
        for _ in range(self.max_takes):
            missing = groups - len(self._ready)
            if missing <= 0:
                break
            prompts = self.rollout.take(math.ceil(missing * self.oversample))
            self.totals.takes += 1
            if not prompts:
                raise RuntimeError(
                    f"the feed handed out no prompt with {len(self._ready)} of {groups} groups ready: its window "
                    "is full; ack or release the prompts you hold, or raise FeedConfig.max_outstanding"
                )
            results = list(self.generate(prompts))
            if len(results) != len(prompts):
                raise ValueError(f"generate returned {len(results)} results for {len(prompts)} prompts; expected one (group, Outcome) each")
            self._account(prompts, results)
            uniform = [(p, o) for p, (_, o) in zip(prompts, results) if o.zero_spread]
            if uniform:
                self.trainer.drop([p.uid for p, _ in uniform], self.reason, outcomes=[o for _, o in uniform])
                extra += len(uniform)
            self._ready += [(p, g, o) for p, (g, o) in zip(prompts, results) if not o.zero_spread]
        else:
            raise RuntimeError(
                f"{self.max_takes} takes gave {len(self._ready)} of {groups} groups with a reward spread; every "
                "prompt came back without spread: check the reward, or the schedule"
            )
        batch, self._ready = self._ready[:groups], self._ready[groups:]
        self.totals.per_batch_extra_groups.append(extra)
        return SampledBatch([p for p, _, _ in batch], [g for _, g, _ in batch], [o for _, _, o in batch])

    def ack(self, batch: SampledBatch) -> None:
        """The batch was trained: ack its prompts with their outcomes."""
        self.trainer.ack(batch.uids, outcomes=batch.outcomes)

    def _account(self, prompts: list[Any], results: list[tuple[Any, Outcome]]) -> None:
        totals = self.totals
        totals.taken += len(prompts)
        for _, outcome in results:
            if not isinstance(outcome, Outcome):
                raise ValueError(f"generate returned {outcome!r} as an outcome, expected an rl_data Outcome")
            totals.samples += outcome.samples
            if outcome.zero_spread:
                totals.dropped += 1
                totals.wasted_samples += outcome.samples
            else:
                totals.kept += 1
