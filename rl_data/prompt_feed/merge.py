"""The global prompt stream: P deterministic producers merged in an order that ignores timing.

A producer yields its prompts in *passes*; pass e of every producer makes epoch e. The merge
asks the producers round-robin, passing over those whose pass of the current epoch is over;
when the last one ends its pass, epoch e+1 starts at producer 0. So epoch e is the zip-longest
interleave of the passes: item 0 of each producer, then item 1 of each that has one, and so
on. An epoch without a prompt is an error. Prompt ``uid = (epoch, position)``, position = its
index in the epoch's merged stream, so the same producers always give the same uids. Each call of a producer is returned as a :class:`Pull` that records the
producer's state and the merge :class:`Cursor` *before* the call: replaying from any pull is
restoring those (see :meth:`MergedStream.position_before`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol


class Uid(NamedTuple):
    """A prompt's identity: its epoch and its position in that epoch's merged stream."""

    epoch: int
    position: int


@dataclass(frozen=True, slots=True)
class Item:
    """One prompt from a producer: a stable content ``key`` (e.g. the sample id) and its payload."""

    key: str
    payload: Any


@dataclass(frozen=True, slots=True)
class PassEnd:
    """A producer's pass is over; its next item starts its next pass."""


PASS_END = PassEnd()


class Producer(Protocol):
    """A deterministic source of prompts in passes, restorable from an opaque JSON-able state."""

    def state(self) -> Any:
        """Its position as a new JSON-able value (not a live view): restoring it replays from here."""

    def restore(self, state: Any) -> None:
        """Go back to a position returned by :meth:`state` (of this or an identical producer)."""

    def next_item(self) -> Item | PassEnd:
        """The next prompt of the current pass, or :data:`PASS_END` once the pass is over."""


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where the merge stands: the next uid, the producer to ask next, producers whose pass ended."""

    epoch: int = 0
    position: int = 0
    producer: int = 0
    finished: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "producer": self.producer, "finished": list(self.finished)}

    @classmethod
    def from_json(cls, value: Any, *, producers: int) -> "Cursor":
        keys = {"epoch", "position", "producer", "finished"}
        if not isinstance(value, dict) or set(value) != keys:
            raise ValueError(f"merge cursor must be a mapping with keys {sorted(keys)}, found {value!r}")
        numbers = (value["epoch"], value["position"], value["producer"])
        finished = value["finished"]
        valid = (
            all(type(n) is int and n >= 0 for n in numbers)
            and value["producer"] < producers
            and isinstance(finished, list)
            and all(type(p) is int and 0 <= p < producers for p in finished)
            and len(set(finished)) == len(finished) < producers
        )
        if not valid:
            raise ValueError(f"merge cursor {value!r} is invalid for {producers} producer(s)")
        return cls(value["epoch"], value["position"], value["producer"], tuple(sorted(finished)))


@dataclass(frozen=True, slots=True)
class Pull:
    """One ``next_item`` call: the producer, its state and the cursor before it, and the result.

    ``uid`` is None for a pass end; ``epoch_size`` is set when that pass end closed the epoch.
    """

    producer: int
    state_before: Any
    cursor_before: Cursor
    uid: Uid | None
    epoch_size: int | None = None


class MergedStream:
    """The producers' prompts in the fixed merge order (see module doc)."""

    def __init__(self, producers: Sequence[Producer]) -> None:
        if not producers:
            raise ValueError("a prompt stream needs at least one producer, found none")
        self.producers = list(producers)
        self.cursor = Cursor()

    def restore(self, states: Sequence[Any], cursor: Cursor) -> None:
        """Restore every producer and the cursor (the caller checked that they fit)."""
        for producer, state in zip(self.producers, states, strict=True):
            producer.restore(state)
        self.cursor = cursor

    def pull(self) -> tuple[Pull, Item | None]:
        """Ask the next producer once; returns the pull and the item (None for a pass end)."""
        before = self.cursor
        count = len(self.producers)
        index = before.producer
        while index in before.finished:
            index = (index + 1) % count
        producer = self.producers[index]
        state = producer.state()
        got = producer.next_item()
        following = (index + 1) % count
        if isinstance(got, PassEnd):
            finished = tuple(sorted((*before.finished, index)))
            if len(finished) < count:
                self.cursor = Cursor(before.epoch, before.position, following, finished)
                return Pull(index, state, before, None), None
            if before.position == 0:
                raise ValueError(
                    f"epoch {before.epoch} is empty: every producer ended its pass without a prompt; "
                    "expected at least one prompt per epoch, give the producers data"
                )
            self.cursor = Cursor(before.epoch + 1)
            return Pull(index, state, before, None, epoch_size=before.position), None
        if not isinstance(got, Item):
            raise TypeError(
                f"producer {index} returned {type(got).__name__} from next_item, expected an Item or "
                "PASS_END; wrap its prompts in rl_data.prompt_feed.merge.Item"
            )
        self.cursor = Cursor(before.epoch, before.position + 1, following, before.finished)
        return Pull(index, state, before, Uid(before.epoch, before.position)), got

    def position_before(self, pulls: Iterable[Pull]) -> tuple[list[Any], Cursor]:
        """Every producer's state and the cursor before the first of ``pulls`` (the pulls made
        since then, in order); with no pulls, the current position.

        Only the pulled producer changes at a pull, so producer p's state then is the state
        before its first pull in ``pulls``, or its current state if it was not pulled since.
        """
        states: list[Any] = [None] * len(self.producers)
        known = [False] * len(self.producers)
        cursor = None
        for pull in pulls:
            if cursor is None:
                cursor = pull.cursor_before
            if not known[pull.producer]:
                states[pull.producer], known[pull.producer] = pull.state_before, True
                if all(known):
                    break
        for index, producer in enumerate(self.producers):
            if not known[index]:
                states[index] = producer.state()
        return states, self.cursor if cursor is None else cursor
