"""The continuation proof: the steps after a restore equal the steps of the uninterrupted run.

Pure: compares ``(step, [rank] -> sample ids)`` pairs and lists every difference.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

StepIds = tuple[int, Sequence[Any]]


@dataclass(frozen=True)
class ContinuationCheck:
    """Result of comparing a resumed run with the reference run."""

    steps_compared: int
    ranks: int
    mismatches: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.mismatches and self.steps_compared > 0

    #: True when the runs had different DP sizes: steps are compared as global multisets.
    global_batches: bool = False

    def verdict(self) -> str:
        """One line: ``PASS: ...`` or ``FAIL: ...``."""
        if self.passed and self.global_batches:
            return (
                f"PASS: the resumed run at another DP size ({self.ranks} ranks) reproduced the global batch of all "
                f"{self.steps_compared} steps after the checkpoint (the same samples per step; DP rank d holds "
                "shards d, d+D, ... in order)"
            )
        if self.passed:
            return (
                f"PASS: the resumed run reproduced all {self.steps_compared} steps x {self.ranks} "
                "ranks after the checkpoint exactly (same sample ids, same order)"
            )
        if self.steps_compared == 0:
            return "FAIL: no steps were compared"
        return f"FAIL: {len(self.mismatches)} differences after the restore: " + "; ".join(self.mismatches[:5])


def compare_continuation(reference: Sequence[StepIds], resumed: Sequence[StepIds]) -> ContinuationCheck:
    """Compare step numbers and, per rank, the sample ids of every step."""
    mismatches = []
    if len(reference) != len(resumed):
        mismatches.append(f"the reference has {len(reference)} steps, the resumed run {len(resumed)}")
    ranks = max((len(ids) for _, ids in reference), default=0)
    for (ref_step, ref_ids), (new_step, new_ids) in zip(reference, resumed):
        if ref_step != new_step:
            mismatches.append(f"step number {new_step}, expected {ref_step}")
        if len(ref_ids) != len(new_ids):
            mismatches.append(f"step {ref_step}: {len(new_ids)} ranks, expected {len(ref_ids)}")
        for rank, (expected, got) in enumerate(zip(ref_ids, new_ids)):
            if list(expected) != list(got):
                mismatches.append(f"step {ref_step} rank {rank}: got {list(got)}, expected {list(expected)}")
    return ContinuationCheck(steps_compared=min(len(reference), len(resumed)), ranks=ranks, mismatches=mismatches)


def _samples(ids: Sequence[Any]) -> list[Any]:
    """One rank's sample ids (a packed batch lists each pack's samples)."""
    return [i for item in ids for i in (item if isinstance(item, (list, tuple)) else [item])]


def compare_global_continuation(reference: Sequence[StepIds], resumed: Sequence[StepIds]) -> ContinuationCheck:
    """Compare step numbers and each step's global multiset of sample ids (the runs' DP sizes differ)."""
    mismatches = []
    if len(reference) != len(resumed):
        mismatches.append(f"the reference has {len(reference)} steps, the resumed run {len(resumed)}")
    for (ref_step, ref_ids), (new_step, new_ids) in zip(reference, resumed):
        if ref_step != new_step:
            mismatches.append(f"step number {new_step}, expected {ref_step}")
        expected = Counter(i for rank in ref_ids for i in _samples(rank))
        got = Counter(i for rank in new_ids for i in _samples(rank))
        if expected != got:
            missing, extra = sorted((expected - got).elements()), sorted((got - expected).elements())
            mismatches.append(f"step {ref_step}: missing {missing[:5]}, unexpected {extra[:5]}")
    ranks = max((len(ids) for _, ids in resumed), default=0)
    return ContinuationCheck(steps_compared=min(len(reference), len(resumed)), ranks=ranks, mismatches=mismatches,
                             global_batches=True)
