"""``PromptLedger``: exactly once per prompt, while prompts finish in any order.

The pure core of the async-RL prompt feed (no Ray, no I/O; the runtime drives it).

* **Stream.** P >= 1 deterministic producers are merged in an order that ignores timing
  (:mod:`rl_data.prompt_feed.merge`): round-robin over the producers whose pass is not over,
  a producer whose pass ended sits out until every producer ended it. Epoch e is pass e of
  every producer, and every prompt has ``uid = (epoch, position)`` in the epoch's merged
  stream. Same data, same producers, same uids, always.
* **Take.** ``take(n)`` hands out up to n prompts (uid, key, payload): released prompts
  first, in uid order, then new ones in uid order. At most ``max_outstanding`` prompts are
  outstanding (handed out, unresolved); ``take`` returns fewer when the window is full and
  never blocks (the runtime offers a waiting mode on top).
* **Resolve**, in any order, each outstanding uid once: ``ack`` (trained), ``drop(reason)``
  (consumed without training, counted per reason, never handed out again this epoch) or
  ``release`` (given back: handed out again before new prompts, same uid, same payload). A
  uid that is not outstanding (resolved, released, not handed out, unknown, or of another
  epoch) raises :class:`UidStateError` naming the uid, its state and what to do; a call is
  all or nothing.
* **Epochs overlap.** Epoch e+1 starts handing out as soon as every prompt of epoch e has
  been *taken* (and no prompt of e is released and waiting); prompts of e may still be
  outstanding, uids tell the epochs apart. ``summary()`` counts per epoch (taken, acked,
  dropped by reason, released, handed out again, outstanding, waiting) and tells, for each
  epoch whose end the stream reached, whether every prompt was resolved exactly once.
* **Checkpoint.** ``state_dict()`` (plain JSON, the history as bytes) holds the producers' states and merge cursor
  at the *low-water mark* (the oldest uid not known resolved), the acked and dropped uids
  above it, the first never-handed-out uid and the counters. ``load_state_dict`` (into a
  ledger over freshly built producers, before its first ``take``) restores the producers
  there; the next takes hand out again every prompt unresolved at checkpoint time
  (outstanding, released, or not yet taken), in uid order, skip the resolved ones, then
  continue exactly as the uninterrupted run. An epoch that ended on a take boundary does not
  restart: the producers are saved after its last prompt, so they next end their pass.
* **Bookkeeping.** For every producer call since the low-water mark the ledger keeps one
  :class:`~rl_data.prompt_feed.merge.Pull` (the called producer's state and the cursor before
  the call: only that producer changes, so the state of producer p at the low-water mark is
  the one before its first call since then, or its current state; P states per prompt are
  not needed), plus the state of each uid from the low-water mark on and the payloads of the
  unresolved ones. All of it is dropped as the low-water mark passes it: memory is
  O(outstanding window + out-of-order span), the span being the uids between the low-water
  mark and the newest taken one (plus at most P pass ends per epoch inside the span). Per
  epoch counters stay (a few ints per epoch).
* **Schedule.** Every prompt the stream reaches that was never handed out is first put to the
  schedule (:mod:`rl_data.prompt_feed.schedules`) and, over a mixture, thinned by the member
  weights in effect at its uid (:meth:`PromptLedger.set_member_weights`): a skipped prompt is
  resolved as ``skipped`` under its reason (counted per epoch and per member, recorded above the
  low-water mark like an ack) and never handed out in that epoch. Exactly once holds over what is
  handed out, and every prompt of an epoch is handed out or skipped. ``ack`` and ``drop`` may
  carry an :class:`~rl_data.prompt_feed.outcomes.Outcome` per uid, kept in the
  :class:`~rl_data.prompt_feed.outcomes.PromptHistory` (16 bytes per prompt) the schedule reads.
  The checkpoint holds the schedule, the history and the weight changes, so a restore repeats
  every decision; with the ``uniform`` schedule, no outcomes and no weights it is what it was
  before schedules existed.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from rl_data.prompt_feed.merge import Cursor, Item, MergedStream, Producer, Pull, Uid
from rl_data.prompt_feed.curation import Curator, add
from rl_data.prompt_feed.epoch_book import DEFAULT_KEPT_EPOCHS, EpochBook
from rl_data.prompt_feed.curation import STATE_KEYS as CURATOR_KEYS
from rl_data.prompt_feed.outcomes import Outcome, checked_outcomes, keys_digest
from rl_data.prompt_feed.schedules import ScheduleConfig
from rl_data.stateful import envelope, open_envelope

OUTSTANDING, RELEASED, ACKED, DROPPED, SKIPPED = "outstanding", "released", "acked", "dropped", "skipped"
RESOLVED = (ACKED, DROPPED, SKIPPED)
#: Prompts one take may skip in a row before it refuses (a schedule that skips everything).
MAX_SKIPPED_IN_A_ROW = 1_000_000


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a checkpoint's uids are built or read: allocating one
    small object per resolved uid with it on made ``state_dict`` and ``load_state_dict`` 10-20x slower
    (50,000 acked above the low-water mark: 1.0 s against 0.07 s, every time; uids hold no cycles)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class UidStateError(ValueError):
    """An ack, drop or release of a uid that is not outstanding."""

    def __init__(self, message: str, *, uid: Uid, state: str) -> None:
        super().__init__(message)
        self.uid, self.state = uid, state

    def __reduce__(self) -> tuple[Any, ...]:  # keyword-only fields: Ray and pickle rebuild it whole
        return _rebuild_uid_state_error, (str(self), tuple(self.uid), self.state)


def _rebuild_uid_state_error(message: str, uid: tuple[int, int], state: str) -> UidStateError:
    return UidStateError(message, uid=Uid(*uid), state=state)


@dataclass(frozen=True, slots=True)
class TakenPrompt:
    """A prompt handed out by :meth:`PromptLedger.take`."""

    uid: Uid
    key: str
    payload: Any


class PromptLedger:
    """Exactly-once bookkeeping of an async prompt feed (see module doc)."""

    STATE_FORMAT = "rl_data.prompt_feed.ledger"
    STATE_VERSION = 1
    KEY_PRODUCERS, KEY_CURSOR = "producers", "cursor"
    KEY_ACKED, KEY_DROPPED, KEY_FRONTIER, KEY_EPOCHS, KEY_SKIPPED = "acked", "dropped", "frontier", "epochs", "skipped"
    KEY_EARLIER = "earlier_epochs"  # present once epochs were folded (rl_data.prompt_feed.epoch_book)
    STATE_KEYS = (KEY_PRODUCERS, KEY_CURSOR, KEY_ACKED, KEY_DROPPED, KEY_FRONTIER, KEY_EPOCHS)
    ADAPTIVE_KEYS = (KEY_SKIPPED, *CURATOR_KEYS)  # all present once a schedule, outcome or weight was used, else none

    def __init__(
        self,
        producers: Sequence[Producer],
        *,
        max_outstanding: int,
        schedule: ScheduleConfig | None = None,
        weight_shares: Callable[[dict[str, float]], dict[str, float]] | None = None,
        kept_epochs: int = DEFAULT_KEPT_EPOCHS,
    ) -> None:
        """``schedule``: which prompts are handed out (default ``uniform``: all of them);
        ``weight_shares``: member weights -> hand-out shares (a mixture feed's; the schedule's
        ``member_weights`` every ``reweight_every`` positions needs it); ``kept_epochs``: ended
        epochs counted one by one, older resolved ones summed (:class:`EpochBook`)."""
        if type(max_outstanding) is not int or max_outstanding < 1:
            raise ValueError(f"max_outstanding must be a positive int, found {max_outstanding!r}")
        self.max_outstanding = max_outstanding
        self.schedule = schedule or ScheduleConfig()
        self.curator = Curator(self.schedule, weight_shares)  # decides what is handed out (rl_data.prompt_feed.curation)
        self._undecided: tuple[Pull, Item] | None = None  # pulled, but its decision raised
        self._stream = MergedStream(producers)
        self._journal: deque[Pull] = deque()  # every producer call since the low-water mark
        self._state: dict[Uid, str] = {}  # uids from the low-water mark on that were pulled or resolved
        self._items: dict[Uid, Item] = {}  # unresolved pulled prompts
        self._released: list[Uid] = []  # heap
        self._outstanding = 0
        self._frontier = Uid(0, 0)  # the first uid never handed out
        self._epochs = EpochBook(kept_epochs)
        self._started = False

    @property
    def epoch(self) -> int:
        """The epoch of the newest prompt pulled (of the restore point before any)."""
        return self._stream.cursor.epoch

    @property
    def outstanding(self) -> int:
        return self._outstanding

    @property
    def low_water_mark(self) -> Uid:
        """The oldest uid not known resolved: the checkpoint replays from here."""
        if self._journal:
            return self._journal[0].uid
        return Uid(self._stream.cursor.epoch, self._stream.cursor.position)

    def take(self, n: int) -> list[TakenPrompt]:
        """Up to ``n`` prompts, fewer when the outstanding window is full; never blocks.

        If a producer raises, the error propagates and the prompts this call already handed
        out are released (they come first next time); the failed producer call is retried.
        """
        if type(n) is not int or n < 0:
            raise ValueError(f"take(n) needs an int n >= 0, found {n!r}")
        self._started = True
        taken: list[TakenPrompt] = []
        try:
            for _ in range(min(n, self.max_outstanding - self._outstanding)):
                uid = heapq.heappop(self._released) if self._released else self._pull_unresolved()
                taken.append(self._hand_out(uid))
        except BaseException:
            self._give_back([t.uid for t in taken])
            raise
        self._trim()
        return taken

    def ack(self, uids: Iterable[Any], outcomes: Sequence[Outcome | None] | None = None) -> None:
        """Outstanding prompts were trained; ``outcomes``: what each earned (None: not known)."""
        checked = self._outstanding_uids(uids, "ack")
        known = checked_outcomes(len(checked), outcomes, "ack")
        for uid, outcome in zip(checked, known):
            self._resolve(uid, ACKED, outcome)
            self._epochs[uid.epoch].acked += 1
        self._trim()

    def drop(self, uids: Iterable[Any], reason: str, outcomes: Sequence[Outcome | None] | None = None) -> None:
        """Outstanding prompts were consumed without training (counted under ``reason``)."""
        if not isinstance(reason, str) or not reason:
            raise ValueError(f"drop needs a non-empty reason string, found {reason!r}")
        checked = self._outstanding_uids(uids, "drop")
        known = checked_outcomes(len(checked), outcomes, "drop")
        for uid, outcome in zip(checked, known):
            self._resolve(uid, DROPPED, outcome)
            add(self._epochs[uid.epoch].dropped, reason)
        self._trim()

    def set_member_weights(self, shares: dict[str, float], at: Sequence[int] | None = None) -> Uid:
        """From uid ``at`` (default: the next prompt the stream reaches) on, hand out each mixture
        member's prompts with probability ``shares[member]`` (in [0, 1]; a member not named: 1) and
        skip the others as ``member_weight``; returns the uid it takes effect at."""
        reached = Uid(self._stream.cursor.epoch, self._stream.cursor.position)
        start = reached if at is None else Uid(*at)
        if start < reached:
            raise ValueError(
                f"member weights cannot take effect at uid {tuple(start)}: the stream already reached "
                f"{tuple(reached)}; name a uid >= {tuple(reached)} or none (the next prompt)"
            )
        self.curator.add_weights(shares, start, self._frontier)
        return start

    def release(self, uids: Iterable[Any]) -> None:
        """Give outstanding prompts back: handed out again, before new ones, in uid order."""
        self._give_back(self._outstanding_uids(uids, "release"))

    def summary(self) -> dict[str, Any]:
        """Counters overall and per epoch.

        ``waiting``: taken, unresolved and not outstanding (released, or back after a restore).
        An epoch's ``size`` (and ``resolved_exactly_once``) is None until its stream ended,
        which the ledger sees when the first prompt of the next epoch is taken. ``skipped_digest``:
        :func:`~rl_data.prompt_feed.outcomes.keys_digest` of the epoch's skipped prompts.
        ``earlier_epochs``: the counts of the folded epochs (``epochs``: first and last) summed, or
        None; ``dropped`` and ``skipped`` are totals over every epoch, folded ones included.
        """
        outstanding = Counter(uid.epoch for uid, state in self._state.items() if state == OUTSTANDING)
        return {
            "epoch": self.epoch, "low_water_mark": list(self.low_water_mark), "outstanding": self._outstanding,
            "released_waiting": len(self._released), **self._epochs.summary(outstanding),
            "bookkeeping": {"pulls": len(self._journal), "uids": len(self._state)}, **self.curator.summary(),
        }  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint: the position at the low-water mark plus what was resolved above it."""
        states, cursor = self._stream.position_before(self._journal)
        with collector_paused():
            resolved = sorted((uid, state) for uid, state in self._state.items() if state in RESOLVED)
            acked = [list(uid) for uid, state in resolved if state == ACKED]
            dropped = [list(uid) for uid, state in resolved if state == DROPPED]
            skipped = [list(uid) for uid, state in resolved if state == SKIPPED]
        fields = {
            self.KEY_PRODUCERS: states,
            self.KEY_CURSOR: cursor.to_json(),
            self.KEY_ACKED: acked,
            self.KEY_DROPPED: dropped,
            self.KEY_FRONTIER: list(self._frontier),
        }
        fields[self.KEY_EPOCHS], earlier = self._epochs.to_json()
        if earlier is not None:
            fields[self.KEY_EARLIER] = earlier
        if self.curator.used() or self._epochs.any_skipped():
            fields.update({self.KEY_SKIPPED: skipped, **self.curator.state()})
        return envelope(self.STATE_FORMAT, self.STATE_VERSION, fields)

    def check_state_dict(self, state: Any) -> None:
        """Raise ``ValueError`` if :meth:`load_state_dict` would refuse ``state`` for its form
        (format, version, keys, producer count, cursor, uids, counters); changes nothing."""
        checked_state(state, producer_count=len(self._stream.producers), curator=self.curator)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint (and the producers) before the first ``take``; all or nothing."""
        if self._started:
            raise ValueError(
                "cannot restore a ledger that already handed out prompts; build a new ledger over "
                "freshly built producers and load the checkpoint there"
            )
        checked = checked_state(state, producer_count=len(self._stream.producers), curator=self.curator)
        self._stream.restore(checked.producers, checked.cursor)
        with collector_paused():
            self._state = {uid: ACKED for uid in checked.acked} | {uid: DROPPED for uid in checked.dropped}
            self._state |= {uid: SKIPPED for uid in checked.skipped}
        self._frontier = checked.frontier
        self._epochs.epochs, self._epochs.earlier = checked.epochs.epochs, checked.epochs.earlier
        self.curator.load(checked.curated)

    def _pull_unresolved(self) -> Uid:
        skipped_in_a_row = 0
        while True:
            if self._undecided is not None:  # a decision that raised: decided again, not lost
                (pull, item), self._undecided = self._undecided, None
            else:
                pull, item = self._stream.pull()
                self._journal.append(pull)
                if pull.epoch_size is not None:
                    self._end_epoch(pull.cursor_before.epoch, pull.epoch_size)
            uid = pull.uid
            if uid is None or self._state.get(uid) in RESOLVED:
                continue
            if uid >= self._frontier:  # never handed out: the weights and the schedule decide
                try:
                    reason = self.curator.decide(uid, item, self._frontier)
                except BaseException:
                    self._undecided = (pull, item)
                    raise
                if reason is not None:
                    self._state[uid] = SKIPPED
                    self._epochs[uid.epoch].skip(reason, item.key)
                    self.curator.skipped(item, reason)
                    skipped_in_a_row += 1
                    if skipped_in_a_row > MAX_SKIPPED_IN_A_ROW:
                        raise ValueError(
                            f"the schedule {self.schedule.name!r} and the member weights skipped {skipped_in_a_row} prompts "
                            f"in a row (up to uid {tuple(uid)}); expected some to be handed out: lower retirement "
                            "(max_retired_share) or raise the weights"
                        )
                    continue
            self._items[uid] = item
            return uid

    def _hand_out(self, uid: Uid) -> TakenPrompt:
        counts = self._epochs[uid.epoch]
        if uid >= self._frontier:
            counts.taken += 1
            self._frontier = Uid(uid.epoch, uid.position + 1)
            self.curator.handed_out(self._items[uid])
        else:
            counts.rehanded += 1
        self._state[uid] = OUTSTANDING
        self._outstanding += 1
        item = self._items[uid]
        return TakenPrompt(uid, item.key, item.payload)

    def _resolve(self, uid: Uid, state: str, outcome: Outcome | None) -> None:
        self._state[uid] = state
        self._outstanding -= 1
        item = self._items.pop(uid)
        if outcome is not None:
            self.curator.observe(item, outcome)

    def _give_back(self, uids: list[Uid]) -> None:
        for uid in uids:
            self._state[uid] = RELEASED
            self._outstanding -= 1
            heapq.heappush(self._released, uid)
            self._epochs[uid.epoch].released += 1

    def _trim(self) -> None:
        """Forget the pulls and uids below the (new) low-water mark."""
        while self._journal:
            uid = self._journal[0].uid
            if uid is not None:
                if self._state.get(uid) not in RESOLVED:
                    return
                del self._state[uid]
            self._journal.popleft()

    def _end_epoch(self, epoch: int, size: int) -> None:
        oldest = self._journal[0].cursor_before.epoch if self._journal else self._stream.cursor.epoch  # the low-water mark's
        self._epochs.end(epoch, size, resolved_below=oldest)

    def _outstanding_uids(self, uids: Iterable[Any], action: str) -> list[Uid]:
        """``uids`` as :class:`Uid`, after checking that each is outstanding and named once."""
        checked: dict[Uid, None] = {}  # ordered, O(1) membership
        for raw in uids:
            if not isinstance(raw, (tuple, list)) or len(raw) != 2 or any(type(v) is not int for v in raw):
                raise ValueError(f"cannot {action} {raw!r}: a uid is an (epoch, position) pair of ints")
            uid = Uid(*raw)
            state, fix = ("named twice in this call", "name each uid once") if uid in checked else self._describe(uid)
            if state != OUTSTANDING:
                raise UidStateError(
                    f"cannot {action} uid {tuple(uid)} (the feed is in epoch {self.epoch}): it is {state}; "
                    f"expected an outstanding uid (handed out by take, not yet resolved or released); {fix}",
                    uid=uid,
                    state=state,
                )
            checked[uid] = None
        return list(checked)

    def _describe(self, uid: Uid) -> tuple[str, str]:
        """A uid's state and what to do about it."""
        resolved_fix = "a prompt is acked or dropped exactly once: resolve only the uids you hold"
        if uid.epoch < 0 or uid.position < 0:
            return "unknown (negative)", "use the uids returned by take"
        size = self._epochs.size(uid.epoch)
        if size is not None and uid.position >= size:
            return f"unknown (epoch {uid.epoch} has {size} prompts)", "use the uids returned by take"
        state = self._state.get(uid)
        if state == OUTSTANDING:
            return state, ""
        if state == RELEASED:
            return "released (waiting to be handed out again)", "take it again before resolving it"
        if state is not None or uid < self.low_water_mark:
            return f"already resolved ({state or 'acked or dropped'})", resolved_fix
        if uid >= self._frontier:
            return "not handed out yet", "use the uids returned by take"
        return "not handed out since the restore", "take it again: a restore hands out every unresolved prompt again"


@dataclass(frozen=True)
class CheckedState:
    """A ledger checkpoint, checked and parsed."""

    producers: list[Any]
    cursor: Cursor
    acked: list[Uid]
    dropped: list[Uid]
    skipped: list[Uid]
    frontier: Uid
    epochs: EpochBook
    curated: tuple[Any, ...]  # the curator's history, member counts and weights


def _uid(value: Any) -> Uid:
    if not isinstance(value, list) or len(value) != 2 or any(type(v) is not int or v < 0 for v in value):
        raise ValueError(f"prompt ledger checkpoint holds {value!r} as a uid, expected [epoch, position]")
    return Uid(*value)


def checked_state(state: Any, *, producer_count: int, curator: Curator) -> CheckedState:
    """A :class:`PromptLedger` checkpoint checked for ``producer_count`` producers and ``curator``'s
    schedule, and parsed; ``ValueError`` saying what is wrong. Changes nothing."""
    ledger = PromptLedger
    adaptive = isinstance(state, dict) and CURATOR_KEYS[0] in state
    fields = ledger.STATE_KEYS + (ledger.ADAPTIVE_KEYS if adaptive else ())
    fields += (ledger.KEY_EARLIER,) if isinstance(state, dict) and ledger.KEY_EARLIER in state else ()
    state = open_envelope(state, fmt=ledger.STATE_FORMAT, version=ledger.STATE_VERSION, what="prompt ledger", fields=fields)
    producers = state[ledger.KEY_PRODUCERS]
    if not isinstance(producers, list) or len(producers) != producer_count:
        found = len(producers) if isinstance(producers, list) else type(producers).__name__
        raise ValueError(
            f"prompt ledger checkpoint holds {found} producer states, this ledger has {producer_count} "
            "producers; restore with the producers the checkpoint was saved with"
        )
    cursor = Cursor.from_json(state[ledger.KEY_CURSOR], producers=producer_count)
    curated = curator.checked_state(state if adaptive else None, _uid)
    with collector_paused():
        acked, dropped, frontier = (
            [_uid(v) for v in state[ledger.KEY_ACKED]],
            [_uid(v) for v in state[ledger.KEY_DROPPED]],
            _uid(state[ledger.KEY_FRONTIER]),
        )
        skipped = [_uid(v) for v in state[ledger.KEY_SKIPPED]] if adaptive else []
    epochs = EpochBook()
    epochs.load(state[ledger.KEY_EPOCHS], state.get(ledger.KEY_EARLIER))
    return CheckedState(producers, cursor, acked, dropped, skipped, frontier, epochs, curated)
