"""``StepBook``: the data coordinator's steps, handed out and committed (pure: no Ray, no I/O).

A step is *pending* from the moment it is handed out until it is committed; the book keeps, per
pending step, every rank's batch ref and the loader state that follows that batch. Committing
step k keeps the states after k (the checkpoint) and forgets the pending steps up to k. The
rules, each refused with a ``ValueError`` naming what is pending:

* a consumer asking for step k (``expected_step``) gets a pending k again or the next new step,
  never a committed step or one past the next;
* only a pending step is re-delivered; a commit covers handed-out steps only, and committing the
  last committed step again changes nothing;
* a checkpoint is the committed step's, or a pending step's (``states_at``).

``origin`` is the checkpoint the coordinator started from: its initial states, or the checkpoint
restored before its first step (a rewind keeps it).

A step the book is done with (committed, or dropped by a reset) keeps its batch refs for
``release_delay`` more such steps (:class:`DelayedRelease`), so that the consumers, who borrow the
refs, release them before the owner does. Ray keeps an owned object's entry in the owner's
in-process store for good when a borrower's release is the last one (the whole batch below Ray's
100 KB inline limit, ~0.4 KB above it): released first by the coordinator, every handed-out batch
would stay in its memory.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, Optional


class DelayedRelease:
    """Holds the last ``steps`` groups of refs given to :meth:`hold`; an older group is released
    (dropped) when a new one arrives."""

    def __init__(self, steps: int) -> None:
        self._held: deque[list[Any]] = deque(maxlen=steps)

    def hold(self, refs: Iterable[Any]) -> None:
        if self._held.maxlen:
            self._held.append(list(refs))

    def __len__(self) -> int:
        """Refs held."""
        return sum(len(group) for group in self._held)


class StepBook:
    """Pending and committed steps, with each step's per-rank batch refs and following states."""

    def __init__(self, release_delay: int = 0) -> None:
        self.committed_step = 0
        self.committed_states: list[dict[str, Any]] = []  # empty until the ranks are ready
        self.handed_step = 0
        #: pending step -> (batch ref per rank, state after that batch per rank)
        self.pending: dict[int, tuple[list[Any], list[dict[str, Any]]]] = {}
        self.origin: Optional[tuple[int, list[dict[str, Any]]]] = None
        #: refs of the last ``release_delay`` steps the book was done with (see the module doc)
        self.released = DelayedRelease(release_delay)

    def reset(self, step: int, states: Sequence[dict[str, Any]], *, origin: bool) -> None:
        """Start (again) after ``step`` with ``states`` committed, nothing pending; ``origin``: it is the new origin."""
        self.committed_step = self.handed_step = step
        self.committed_states = list(states)
        for pending in sorted(self.pending):
            self.released.hold(self.pending[pending][0])
        self.pending.clear()
        if origin:
            self.origin = (step, list(states))

    def pending_range(self) -> str:
        first, last = self.committed_step + 1, self.handed_step
        return "none" if last < first else f"{first}..{last}"

    def step_to_hand_out(self, expected: Optional[int]) -> int:
        """The step a ``next_step(expected_step=expected)`` returns (None: the next new one)."""
        if expected is None:
            return self.handed_step + 1
        if expected <= self.committed_step or expected > self.handed_step + 1:
            committed = "" if expected > self.committed_step else f"step {expected} is already committed; "
            raise ValueError(
                f"cannot hand out step {expected}: {committed}the pending steps are {self.pending_range()} "
                f"and the next new step is {self.handed_step + 1}; ask for one of those"
            )
        return expected

    def check_pending(self, step: int) -> None:
        """Refuse to re-deliver a step that is not pending."""
        if not self.committed_step < step <= self.handed_step:
            raise ValueError(
                f"cannot re-deliver step {step}: the pending steps (handed out, not committed) are "
                f"{self.pending_range()}; ask next_step for a new step"
            )

    def hand_out(self, refs: list[Any], states: list[dict[str, Any]]) -> int:
        """Record the next new step (each rank's batch ref and following state); return it."""
        self.handed_step += 1
        self.pending[self.handed_step] = (list(refs), list(states))
        return self.handed_step

    def commit(self, step: int) -> list[int]:
        """Commit every step through ``step``; return the pending steps it resolved ([] when
        ``step`` is the last committed one)."""
        if step == self.committed_step:
            return []
        if step < self.committed_step:
            raise ValueError(f"cannot commit step {step}: step {self.committed_step} is already committed")
        if step > self.handed_step:
            raise ValueError(
                f"cannot commit step {step}: the last step handed out is {self.handed_step}; "
                "commit only steps returned by next_step"
            )
        self.committed_states = list(self.pending[step][1])
        done = list(range(self.committed_step + 1, step + 1))
        for resolved in done:
            self.released.hold(self.pending.pop(resolved)[0])
        self.committed_step = step
        return done

    def states_at(self, step: Optional[int]) -> tuple[int, list[dict[str, Any]]]:
        """The committed step (``step`` None or committed) or pending ``step``, and a copy of its states."""
        if step is None or step == self.committed_step:
            return self.committed_step, list(self.committed_states)
        if step not in self.pending:
            raise ValueError(
                f"no checkpoint of step {step}: the last committed step is {self.committed_step} and the "
                f"pending steps are {self.pending_range()}"
            )
        return step, list(self.pending[step][1])

    def replace_state(self, step: int, rank: int, old: dict[str, Any], new: dict[str, Any]) -> None:
        """Put ``new`` where rank's state ``old`` of ``step`` is still kept (committed or pending)."""
        if self.committed_states[rank] is old:
            self.committed_states[rank] = new
        if step in self.pending and self.pending[step][1][rank] is old:
            self.pending[step][1][rank] = new

    def reproduced(self, step: int, rank: int, ref: Any, state: dict[str, Any]) -> None:
        """Rank's replacement re-produced its batch of ``step`` (ignored once the step is committed)."""
        if step in self.pending:
            self.pending[step][0][rank] = ref
            self.pending[step][1][rank] = state
