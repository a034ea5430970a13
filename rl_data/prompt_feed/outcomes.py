"""Outcomes of prompts and their compact per-prompt history (pure: numpy, no Ray, no I/O).

An :class:`Outcome` is what one hand-out of a prompt earned: how many samples were generated and
either how many were right or their mean reward (in [0, 1]) and its spread. ``ack`` and ``drop``
of the prompt feed may carry one per uid.

:class:`PromptHistory` keeps, for every prompt that ever had an outcome, a 16-byte entry: an
8-byte hash of the prompt's key and an 8-byte :data:`RECORD` (tries, the current run of solved or
failed tries, the pass rate's moving average, samples generated, the schedule's deferral count and
flags). The entries sit in two sorted numpy arrays (new keys wait in a small dict until
:data:`MERGE_EVERY` of them are merged in), and the checkpoint holds the same arrays as bytes: 16
bytes per prompt in memory and in the checkpoint. Two keys whose 64-bit hashes collide share an
entry (about 3e-8 for 1 M prompts).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Optional

import numpy as np

#: One prompt's history: 8 bytes.
RECORD = np.dtype([
    ("tries", "u1"),  # hand-outs with an outcome (saturates at 255)
    ("streak", "i1"),  # > 0: the last n tries were solved, < 0: the last -n failed (saturates at +-127)
    ("skip_left", "u1"),  # appearances the schedule still skips (deferred)
    ("flags", "u1"),  # bit 0: retired, bit 1: deferred since its last try (set by the schedule)
    ("pass_rate", "<u2"),  # moving average of the tries' pass rates, x 65535
    ("generated", "<u2"),  # samples generated for it (saturates at 65535)
])  # fmt: skip
#: New keys merged into the sorted arrays at once.
MERGE_EVERY = 4096
#: Weight of the newest try in the pass rate's moving average.
PASS_RATE_STEP = 0.5


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one hand-out of a prompt earned.

    ``samples``: generations made for it (>= 1). Then ``correct`` (how many of them were right),
    or ``mean_reward`` in [0, 1] with ``reward_std`` (the rewards' spread; 0 means every sample
    got the same reward). :meth:`from_rewards` builds one from a group's rewards.
    """

    samples: int
    correct: Optional[int] = None
    mean_reward: Optional[float] = None
    reward_std: Optional[float] = None

    def __post_init__(self) -> None:
        if type(self.samples) is not int or self.samples < 1:
            raise ValueError(f"Outcome.samples must be an int >= 1, found {self.samples!r}")
        if self.correct is None and self.mean_reward is None:
            raise ValueError("an Outcome needs correct (how many samples were right) or mean_reward; found neither")
        if self.correct is not None and (type(self.correct) is not int or not 0 <= self.correct <= self.samples):
            raise ValueError(f"Outcome.correct must be an int in [0, samples={self.samples}], found {self.correct!r}")
        if self.mean_reward is not None and not (isinstance(self.mean_reward, (int, float)) and 0.0 <= self.mean_reward <= 1.0):
            raise ValueError(
                f"Outcome.mean_reward must be in [0, 1], found {self.mean_reward!r}; rescale the rewards or give correct"
            )
        if self.reward_std is not None and not (isinstance(self.reward_std, (int, float)) and self.reward_std >= 0):
            raise ValueError(f"Outcome.reward_std must be a number >= 0, found {self.reward_std!r}")

    @classmethod
    def from_rewards(cls, rewards: Sequence[float], *, correct_at: Optional[float] = None) -> "Outcome":
        """The outcome of a group of rewards in [0, 1]; ``correct_at``: a reward at least this is right."""
        values = [float(r) for r in rewards]
        if not values or any(math.isnan(v) for v in values):
            raise ValueError(f"Outcome.from_rewards needs at least one reward and no NaN, found {values}")
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        correct = None if correct_at is None else sum(v >= correct_at for v in values)
        return cls(len(values), correct=correct, mean_reward=min(1.0, max(0.0, mean)), reward_std=std)

    @property
    def pass_rate(self) -> float:
        return self.correct / self.samples if self.correct is not None else float(self.mean_reward)

    @property
    def zero_spread(self) -> bool:
        """Every sample earned the same reward: a group with no advantage to learn from."""
        if self.reward_std is not None:
            return self.reward_std == 0
        return self.pass_rate in (0.0, 1.0)


@dataclass(frozen=True, slots=True)
class PromptRecord:
    """One prompt's history, as a schedule reads and updates it."""

    tries: int = 0
    streak: int = 0
    skip_left: int = 0
    retired: bool = False
    deferred: bool = False  # deferred since its last try
    pass_rate: float = 0.0
    generated: int = 0

    def after(self, outcome: Outcome) -> "PromptRecord":
        """This record once ``outcome`` is known."""
        rate = outcome.pass_rate
        solved, failed = rate >= 1.0, rate <= 0.0
        if solved:
            streak = max(self.streak, 0) + 1
        elif failed:
            streak = min(self.streak, 0) - 1
        else:
            streak = 0
        average = rate if self.tries == 0 else (1 - PASS_RATE_STEP) * self.pass_rate + PASS_RATE_STEP * rate
        return replace(
            self, tries=min(self.tries + 1, 255), streak=max(-127, min(127, streak)), pass_rate=average,
            generated=min(self.generated + outcome.samples, 65535), deferred=False,
        )  # fmt: skip


def checked_outcomes(count: int, outcomes: Sequence[Any] | None, action: str) -> list[Outcome | None]:
    """``outcomes`` for ``count`` uids of an ``action`` (None: ``count`` Nones); ``ValueError`` for
    another length or a value that is neither an ``Outcome`` nor None."""
    if outcomes is None:
        return [None] * count
    outcomes = list(outcomes)
    if len(outcomes) != count:
        raise ValueError(f"{action} got {count} uids and {len(outcomes)} outcomes; give one outcome (or None) per uid")
    for outcome in outcomes:
        if outcome is not None and not isinstance(outcome, Outcome):
            raise ValueError(
                f"{action} got {outcome!r} as an outcome, expected rl_data.Outcome or None; build one with "
                "Outcome(samples, correct=...) or Outcome.from_rewards(rewards)"
            )
    return outcomes


def key_hash(key: str) -> int:
    """The 64-bit hash a prompt's key is stored under."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def keys_digest(keys: Iterable[str], start: int = 0) -> int:
    """``start`` plus the :func:`key_hash` of every key, modulo 2**64: the same for the same keys in
    any order (a repeated key counts twice). A prompt feed reports the digest of each epoch's
    skipped prompts (``status()["epochs"][i]["skipped_digest"]``): compare it with the digest of the
    prompts of the pass that a trainer never resolved to check that those were exactly the skipped ones."""
    return (start + sum(key_hash(key) for key in keys)) % 2**64


def _packed(record: PromptRecord) -> tuple[int, ...]:
    flags = int(record.retired) | int(record.deferred) << 1
    return (record.tries, record.streak, record.skip_left, flags, round(record.pass_rate * 65535), record.generated)


def _unpacked(values: Any) -> PromptRecord:
    tries, streak, skip_left, flags, rate, generated = (int(v) for v in values)
    return PromptRecord(tries, streak, skip_left, bool(flags & 1), bool(flags & 2), rate / 65535, generated)


class PromptHistory:
    """Every prompt's :class:`PromptRecord`, 16 bytes each (see the module doc)."""

    STATE_KEYS = ("keys", "records")

    def __init__(self) -> None:
        self._keys = np.empty(0, dtype="<u8")
        self._records = np.empty(0, dtype=RECORD)
        self._pending: dict[int, tuple[int, ...]] = {}
        self.retired = 0
        self.deferred = 0  # records with appearances still to skip

    def __len__(self) -> int:
        return len(self._keys) + len(self._pending)

    @property
    def nbytes(self) -> int:
        """Bytes held by the merged entries (the pending ones, at most :data:`MERGE_EVERY`, aside)."""
        return self._keys.nbytes + self._records.nbytes

    def get(self, key: str) -> Optional[PromptRecord]:
        """The record of the prompt ``key``, None if it never had one."""
        hashed = key_hash(key)
        if hashed in self._pending:
            return _unpacked(self._pending[hashed])
        index = self._index(hashed)
        return None if index is None else _unpacked(self._records[index].item())

    def put(self, key: str, record: PromptRecord) -> None:
        """Store ``record`` as the history of ``key``."""
        old = self.get(key)
        self.retired += int(record.retired) - int(old is not None and old.retired)
        self.deferred += int(record.skip_left > 0) - int(old is not None and old.skip_left > 0)
        hashed = key_hash(key)
        index = None if hashed in self._pending else self._index(hashed)
        if index is not None:
            self._records[index] = _packed(record)
            return
        self._pending[hashed] = _packed(record)
        if len(self._pending) >= MERGE_EVERY:
            self._merge()

    def observe(self, key: str, outcome: Outcome) -> PromptRecord:
        """Record ``outcome`` for ``key``; returns the new record."""
        record = (self.get(key) or PromptRecord()).after(outcome)
        self.put(key, record)
        return record

    def state(self) -> dict[str, bytes]:
        """The history as bytes: 8 per key hash and 8 per record, sorted by hash."""
        self._merge()
        return {"keys": self._keys.tobytes(), "records": self._records.tobytes()}

    @classmethod
    def from_state(cls, state: Any) -> "PromptHistory":
        """A history from :meth:`state`; ``ValueError`` if it is not one."""
        if not isinstance(state, dict) or set(state) != set(cls.STATE_KEYS) or not all(isinstance(v, bytes) for v in state.values()):
            found = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"prompt history state has {found}, expected bytes under {list(cls.STATE_KEYS)}")
        keys, records = state["keys"], state["records"]
        if len(keys) % 8 or len(records) != len(keys):
            raise ValueError(
                f"prompt history state holds {len(keys)} bytes of keys and {len(records)} of records, expected "
                "8 bytes each per prompt; the checkpoint is damaged"
            )
        history = cls()
        history._keys = np.frombuffer(keys, dtype="<u8").copy()
        history._records = np.frombuffer(records, dtype=RECORD).copy()
        if len(history._keys) > 1 and not bool(np.all(history._keys[1:] > history._keys[:-1])):
            raise ValueError("prompt history state holds unsorted or repeated key hashes; the checkpoint is damaged")
        history.retired = int(np.count_nonzero(history._records["flags"] & 1))
        history.deferred = int(np.count_nonzero(history._records["skip_left"]))
        return history

    def _index(self, hashed: int) -> Optional[int]:
        index = int(np.searchsorted(self._keys, np.uint64(hashed)))
        return index if index < len(self._keys) and int(self._keys[index]) == hashed else None

    def _merge(self) -> None:
        if not self._pending:
            return
        keys = np.fromiter(self._pending, dtype="<u8", count=len(self._pending))
        records = np.array(list(self._pending.values()), dtype=RECORD)
        order = np.argsort(keys)
        at = np.searchsorted(self._keys, keys[order])
        self._keys = np.insert(self._keys, at, keys[order])
        self._records = np.insert(self._records, at, records[order])
        self._pending.clear()
