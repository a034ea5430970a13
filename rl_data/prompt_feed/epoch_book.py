"""Per-epoch accounting of a prompt ledger, bounded: :class:`EpochBook`.

Each epoch has its :class:`EpochCounts` (taken, re-handed, released, acked, dropped and skipped by
reason, and its size once its stream ended). An ended epoch whose every prompt is resolved (below
the low-water mark) and that is older than the newest ``kept_epochs`` ended ones is **folded**: its
counts are added to one :class:`EpochCounts` of all the earlier epochs, so the book (in memory, in
``status()`` and in the checkpoint) holds at most ``kept_epochs`` + the open epochs one by one
however long the run. Totals over every epoch include the folded ones. Pure: no Ray, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from rl_data.prompt_feed.curation import add
from rl_data.prompt_feed.outcomes import keys_digest

#: Ended epochs listed one by one by default (older ones are folded).
DEFAULT_KEPT_EPOCHS = 32


@dataclass(slots=True)
class EpochCounts:
    """One epoch's accounting (or the sum of folded epochs); ``size`` is known once its stream ended."""

    size: int | None = None
    taken: int = 0  # distinct prompts handed out
    rehanded: int = 0  # hand-outs of a prompt handed out before (after release or restore)
    released: int = 0
    acked: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)  # by the schedule or a member weight, per reason
    skipped_digest: int = 0  # keys_digest of the skipped prompts' keys

    def resolved(self) -> int:
        return self.acked + sum(self.dropped.values()) + sum(self.skipped.values())

    def skip(self, reason: str, key: str) -> None:
        add(self.skipped, reason)
        self.skipped_digest = keys_digest([key], self.skipped_digest)

    def absorb(self, other: "EpochCounts") -> None:
        """Add ``other`` (an ended epoch) to these counts."""
        self.size = (self.size or 0) + (other.size or 0)
        self.taken += other.taken
        self.rehanded += other.rehanded
        self.released += other.released
        self.acked += other.acked
        for reason, n in other.dropped.items():
            add(self.dropped, reason, n)
        for reason, n in other.skipped.items():
            add(self.skipped, reason, n)
        self.skipped_digest = (self.skipped_digest + other.skipped_digest) % 2**64

    def to_json(self, **where: Any) -> dict[str, Any]:
        entry = {**where, "size": self.size, "taken": self.taken, "rehanded": self.rehanded,
                 "released": self.released, "acked": self.acked, "dropped": dict(self.dropped)}  # fmt: skip
        if self.skipped:
            entry.update(skipped=dict(self.skipped), skipped_digest=self.skipped_digest)
        return entry

    @classmethod
    def from_json(cls, entry: Any, where: tuple[str, ...]) -> tuple[list[Any], "EpochCounts"]:
        """``([entry[k] for k in where], counts)``; ``ValueError`` for any other shape."""
        try:
            values = dict(entry)
            located = [values.pop(key) for key in where]
            return located, cls(**values)
        except (TypeError, ValueError, KeyError):
            expected = [*where, *(f.name for f in fields(cls))]
            raise ValueError(
                f"prompt ledger checkpoint holds epoch counts {entry!r}, expected a mapping with keys "
                f"{expected}; it was not saved by this rl_data version"
            ) from None


class EpochBook:
    """Every epoch's :class:`EpochCounts`, the ended and resolved ones beyond ``kept_epochs`` folded."""

    def __init__(self, kept_epochs: int = DEFAULT_KEPT_EPOCHS) -> None:
        if type(kept_epochs) is not int or kept_epochs < 1:
            raise ValueError(f"kept_epochs must be an int >= 1, found {kept_epochs!r}")
        self.kept_epochs = kept_epochs
        self.epochs: dict[int, EpochCounts] = {}
        self.earlier: tuple[list[int], EpochCounts] | None = None  # ([first, last] epoch folded, their sum)

    def __getitem__(self, epoch: int) -> EpochCounts:
        """The counts of ``epoch`` (created empty); a folded epoch is refused (``KeyError``)."""
        if self.earlier is not None and epoch <= self.earlier[0][1]:
            raise KeyError(f"epoch {epoch} is folded into epochs {self.earlier[0]}")
        return self.epochs.setdefault(epoch, EpochCounts())

    def size(self, epoch: int) -> int | None:
        counts = self.epochs.get(epoch)
        return None if counts is None else counts.size

    def end(self, epoch: int, size: int, resolved_below: int) -> None:
        """The stream of ``epoch`` ended with ``size`` prompts; fold what may be (every epoch before
        ``resolved_below`` is resolved)."""
        counts = self[epoch]
        if counts.size is not None and counts.size != size:
            raise ValueError(
                f"epoch {epoch} had {counts.size} prompts when the checkpoint was saved and has {size} "
                "after the restore; expected the same: the producers are not deterministic or not "
                "built over the same data"
            )
        counts.size = size
        below = min(resolved_below, epoch + 1 - self.kept_epochs)
        for old in sorted(e for e in self.epochs if e < below):
            folded = self.epochs.pop(old)
            span, total = self.earlier or ([old, old], EpochCounts(size=0))
            total.absorb(folded)
            self.earlier = ([span[0], old], total)

    def any_skipped(self) -> bool:
        return any(c.skipped for c in self.epochs.values()) or bool(self.earlier and self.earlier[1].skipped)

    def summary(self, outstanding: dict[int, int]) -> dict[str, Any]:
        """``epochs`` (one entry each; ``outstanding``: per epoch), ``earlier_epochs`` (the folded
        ones summed, or None) and the ``dropped`` and ``skipped`` totals over every epoch."""
        epochs, dropped, skipped = [], {}, {}
        for epoch, counts in sorted(self.epochs.items()):
            live = outstanding.get(epoch, 0)
            epochs.append({
                **counts.to_json(epoch=epoch), "dropped": dict(counts.dropped), "skipped": dict(counts.skipped),
                "skipped_digest": counts.skipped_digest, "outstanding": live,
                "waiting": counts.taken - counts.resolved() - live,
                "resolved_exactly_once": None if counts.size is None else counts.resolved() == counts.size,
            })  # fmt: skip
        earlier = None
        if self.earlier is not None:
            span, total = self.earlier
            earlier = {**total.to_json(epochs=list(span)), "resolved_exactly_once": total.resolved() == total.size}
        for counts in [*self.epochs.values(), *([self.earlier[1]] if self.earlier else [])]:
            for reason, n in counts.dropped.items():
                add(dropped, reason, n)
            for reason, n in counts.skipped.items():
                add(skipped, reason, n)
        return {"epochs": epochs, "earlier_epochs": earlier, "dropped": dropped, "skipped": skipped}

    def to_json(self) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """The epochs one by one, and the folded ones (None before any fold)."""
        listed = [c.to_json(epoch=e) for e, c in sorted(self.epochs.items())]
        return listed, None if self.earlier is None else self.earlier[1].to_json(epochs=list(self.earlier[0]))

    def load(self, listed: Any, earlier: Any) -> None:
        """Replace the book with :meth:`to_json`'s output, checked first (``ValueError``, nothing changed)."""
        epochs = {}
        for entry in listed:
            (epoch,), counts = EpochCounts.from_json(entry, ("epoch",))
            epochs[epoch] = counts
        folded = None
        if earlier is not None:
            (span,), total = EpochCounts.from_json(earlier, ("epochs",))
            if not isinstance(span, list) or len(span) != 2 or any(type(e) is not int for e in span) or span[0] > span[1]:
                raise ValueError(f"prompt ledger checkpoint folds epochs {span!r}, expected [first, last]")
            if epochs and min(epochs) <= span[1]:
                raise ValueError(f"prompt ledger checkpoint lists epoch {min(epochs)} and folds epochs {span}; it is damaged")
            folded = (span, total)
        self.epochs, self.earlier = epochs, folded
