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
from rl_data.prompt_feed.outcomes import Outcome, PromptHistory
from rl_data.prompt_feed.schedules import Decision, ScheduleConfig, draw
from rl_data.stateful import envelope, open_envelope

OUTSTANDING, RELEASED, ACKED, DROPPED, SKIPPED = "outstanding", "released", "acked", "dropped", "skipped"
RESOLVED = (ACKED, DROPPED, SKIPPED)
#: The skip reason of a prompt thinned out by its mixture member's weight.
MEMBER_WEIGHT = "member_weight"
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


@dataclass(slots=True)
class EpochCounts:
    """One epoch's accounting; ``size`` is known once its stream ended."""

    size: int | None = None
    taken: int = 0  # distinct prompts handed out
    rehanded: int = 0  # hand-outs of a prompt handed out before (after release or restore)
    released: int = 0
    acked: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)  # by the schedule or a member weight, per reason

    def resolved(self) -> int:
        return self.acked + sum(self.dropped.values()) + sum(self.skipped.values())

    def to_json(self, epoch: int) -> dict[str, Any]:
        entry = {"epoch": epoch, "size": self.size, "taken": self.taken, "rehanded": self.rehanded,
                 "released": self.released, "acked": self.acked, "dropped": dict(self.dropped)}  # fmt: skip
        if self.skipped:
            entry["skipped"] = dict(self.skipped)
        return entry


@dataclass(slots=True)
class MemberCounts:
    """One mixture member's accounting: prompts handed out, skipped per reason, outcomes and their pass rates."""

    taken: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    outcomes: int = 0
    pass_rate_sum: float = 0.0
    generated: int = 0
    zero_spread: int = 0


def add(counts: dict[str, int], reason: str, n: int = 1) -> None:
    counts[reason] = counts.get(reason, 0) + n


class PromptLedger:
    """Exactly-once bookkeeping of an async prompt feed (see module doc)."""

    STATE_FORMAT = "rl_data.prompt_feed.ledger"
    STATE_VERSION = 1
    KEY_PRODUCERS, KEY_CURSOR = "producers", "cursor"
    KEY_ACKED, KEY_DROPPED, KEY_FRONTIER, KEY_EPOCHS = "acked", "dropped", "frontier", "epochs"
    STATE_KEYS = (KEY_PRODUCERS, KEY_CURSOR, KEY_ACKED, KEY_DROPPED, KEY_FRONTIER, KEY_EPOCHS)
    KEY_SKIPPED, KEY_SCHEDULE, KEY_HISTORY, KEY_MEMBERS, KEY_WEIGHTS = "skipped", "schedule", "history", "members", "member_weights"
    #: Present when a schedule, an outcome or a weight was ever used (absent, the state is as before schedules).
    ADAPTIVE_KEYS = (KEY_SKIPPED, KEY_SCHEDULE, KEY_HISTORY, KEY_MEMBERS, KEY_WEIGHTS)

    def __init__(
        self,
        producers: Sequence[Producer],
        *,
        max_outstanding: int,
        schedule: ScheduleConfig | None = None,
        weight_shares: Callable[[dict[str, float]], dict[str, float]] | None = None,
    ) -> None:
        """``schedule``: which prompts are handed out (default ``uniform``: all of them);
        ``weight_shares``: member weights -> hand-out shares (a mixture feed's; the schedule's
        ``member_weights`` every ``reweight_every`` positions needs it)."""
        if type(max_outstanding) is not int or max_outstanding < 1:
            raise ValueError(f"max_outstanding must be a positive int, found {max_outstanding!r}")
        self.max_outstanding = max_outstanding
        self.schedule = schedule or ScheduleConfig()
        self._schedule = self.schedule.build()
        if self.schedule.reweight_every and weight_shares is None:
            raise ValueError(
                f"schedule {self.schedule.name!r} has reweight_every {self.schedule.reweight_every}, which needs a feed over a "
                "mixture of datasets; set reweight_every 0"
            )
        self._weight_shares = weight_shares
        self._history = PromptHistory()
        self._members: dict[str, MemberCounts] = {}
        self._weights: list[tuple[Uid, dict[str, float]]] = []  # (from uid, member -> hand-out share), by uid
        self._events: Counter = Counter()  # for metrics, since the last pop_events (not checkpointed)
        self._undecided: tuple[Pull, Item] | None = None  # pulled, but its decision raised
        self._reweighed_at: Uid | None = None
        self._stream = MergedStream(producers)
        self._journal: deque[Pull] = deque()  # every producer call since the low-water mark
        self._state: dict[Uid, str] = {}  # uids from the low-water mark on that were pulled or resolved
        self._items: dict[Uid, Item] = {}  # unresolved pulled prompts
        self._released: list[Uid] = []  # heap
        self._outstanding = 0
        self._frontier = Uid(0, 0)  # the first uid never handed out
        self._epochs: dict[int, EpochCounts] = {}
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
        known = self._checked_outcomes(checked, outcomes, "ack")
        for uid, outcome in zip(checked, known):
            self._resolve(uid, ACKED, outcome)
            self._counts(uid.epoch).acked += 1
        self._trim()

    def drop(self, uids: Iterable[Any], reason: str, outcomes: Sequence[Outcome | None] | None = None) -> None:
        """Outstanding prompts were consumed without training (counted under ``reason``)."""
        if not isinstance(reason, str) or not reason:
            raise ValueError(f"drop needs a non-empty reason string, found {reason!r}")
        checked = self._outstanding_uids(uids, "drop")
        known = self._checked_outcomes(checked, outcomes, "drop")
        for uid, outcome in zip(checked, known):
            self._resolve(uid, DROPPED, outcome)
            add(self._counts(uid.epoch).dropped, reason)
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
        bad = {m: v for m, v in shares.items() if not isinstance(m, str) or not isinstance(v, (int, float)) or not 0 <= v <= 1}
        if bad:
            raise ValueError(f"member shares must map member names to numbers in [0, 1], found {bad!r}")
        self._add_weights(shares, start)
        return start

    def _add_weights(self, shares: dict[str, float], start: Uid) -> None:
        changes = sorted([*self._weights, (start, {m: float(v) for m, v in sorted(shares.items())})], key=lambda c: c[0])
        settled = [c for c in changes if c[0] <= self._frontier]  # no prompt below the frontier is decided again
        self._weights = settled[-1:] + [c for c in changes if c[0] > self._frontier]

    def release(self, uids: Iterable[Any]) -> None:
        """Give outstanding prompts back: handed out again, before new ones, in uid order."""
        self._give_back(self._outstanding_uids(uids, "release"))

    def pop_events(self) -> Counter:
        """What happened since the last call, for metrics: ``("skipped", reason, member)``, and per
        member ``("outcomes" | "zero_spread" | "generated", member)`` (member ``""`` outside a mixture)."""
        events, self._events = self._events, Counter()
        return events

    def member_pass_rates(self) -> dict[str, float]:
        """Each mixture member's mean pass rate over the outcomes received."""
        return {name: c.pass_rate_sum / c.outcomes for name, c in self._members.items() if c.outcomes}

    def summary(self) -> dict[str, Any]:
        """Counters overall and per epoch.

        ``waiting``: taken, unresolved and not outstanding (released, or back after a restore).
        An epoch's ``size`` (and ``resolved_exactly_once``) is None until its stream ended,
        which the ledger sees when the first prompt of the next epoch is taken.
        """
        outstanding: dict[int, int] = {}
        for uid, state in self._state.items():
            if state == OUTSTANDING:
                outstanding[uid.epoch] = outstanding.get(uid.epoch, 0) + 1
        epochs, dropped = [], {}
        for epoch, counts in sorted(self._epochs.items()):
            live = outstanding.get(epoch, 0)
            for reason, count in counts.dropped.items():
                dropped[reason] = dropped.get(reason, 0) + count
            epochs.append({
                "epoch": epoch, "size": counts.size, "taken": counts.taken, "rehanded": counts.rehanded,
                "released": counts.released, "acked": counts.acked, "dropped": dict(counts.dropped),
                "skipped": dict(counts.skipped), "outstanding": live, "waiting": counts.taken - counts.resolved() - live,
                "resolved_exactly_once": None if counts.size is None else counts.resolved() == counts.size,
            })  # fmt: skip
        skipped: dict[str, int] = {}
        for counts in self._epochs.values():
            for reason, count in counts.skipped.items():
                add(skipped, reason, count)
        return {
            "epoch": self.epoch, "low_water_mark": list(self.low_water_mark), "outstanding": self._outstanding,
            "released_waiting": len(self._released), "dropped": dropped, "skipped": skipped, "epochs": epochs,
            "bookkeeping": {"pulls": len(self._journal), "uids": len(self._state)},
            "schedule": self.schedule.describe(),
            "history": {"prompts": len(self._history), "bytes": self._history.nbytes, "retired": self._history.retired},
            "members": {name: member_summary(c) for name, c in sorted(self._members.items())},
            "member_weights": [[*uid, dict(shares)] for uid, shares in self._weights],
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
            self.KEY_EPOCHS: [c.to_json(e) for e, c in sorted(self._epochs.items())],
        }
        if self._adaptive():
            fields.update({
                self.KEY_SKIPPED: skipped,
                self.KEY_SCHEDULE: self.schedule.describe(),
                self.KEY_HISTORY: self._history.state() if len(self._history) else None,
                self.KEY_MEMBERS: {name: member_json(c) for name, c in sorted(self._members.items())},
                self.KEY_WEIGHTS: [[*uid, dict(shares)] for uid, shares in self._weights],
            })  # fmt: skip
        return envelope(self.STATE_FORMAT, self.STATE_VERSION, fields)

    def check_state_dict(self, state: Any) -> None:
        """Raise ``ValueError`` if :meth:`load_state_dict` would refuse ``state`` for its form
        (format, version, keys, producer count, cursor, uids, counters); changes nothing."""
        self._checked_state(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint (and the producers) before the first ``take``; all or nothing."""
        if self._started:
            raise ValueError(
                "cannot restore a ledger that already handed out prompts; build a new ledger over "
                "freshly built producers and load the checkpoint there"
            )
        checked = self._checked_state(state)
        self._stream.restore(checked.producers, checked.cursor)
        with collector_paused():
            self._state = {uid: ACKED for uid in checked.acked} | {uid: DROPPED for uid in checked.dropped}
            self._state |= {uid: SKIPPED for uid in checked.skipped}
        self._frontier, self._epochs = checked.frontier, checked.epochs
        self._history, self._members, self._weights = checked.history, checked.members, checked.weights

    def _adaptive(self) -> bool:
        """Whether the state needs :data:`ADAPTIVE_KEYS` (anything beyond a uniform feed without outcomes)."""
        uniform = self.schedule.describe() == ScheduleConfig().describe()
        skipped = any(c.skipped for c in self._epochs.values())
        return not uniform or bool(len(self._history) or self._members or self._weights or skipped)

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
                    reason = self._decide(uid, item)
                except BaseException:
                    self._undecided = (pull, item)
                    raise
                if reason is not None:
                    self._state[uid] = SKIPPED
                    add(self._counts(uid.epoch).skipped, reason)
                    self._events["skipped", reason, member_name(item) or ""] += 1
                    member = self._member(item)
                    if member is not None:
                        add(member.skipped, reason)
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

    def _decide(self, uid: Uid, item: Item) -> str | None:
        """The skip reason of a prompt reached for the first time, None to hand it out."""
        seed = self.schedule.seed
        every = self.schedule.reweight_every
        if every and uid.position % every == 0 and uid.position and self._reweighed_at != uid:
            weights = self._schedule.member_weights({name: member_summary(c) for name, c in sorted(self._members.items())})
            if weights is not None:
                self._add_weights(self._weight_shares(weights), uid)
            self._reweighed_at = uid  # a decision retried after it raised does not ask again
        shares = self._shares_at(uid)
        name = member_name(item)
        if shares and name is not None and draw(seed, uid.epoch, uid.position, "member\x1f" + item.key) >= shares.get(name, 1.0):
            return MEMBER_WEIGHT
        history = self._history
        retired_share = history.retired / len(history) if len(history) else 0.0
        decision = self._schedule.decide(history.get(item.key), draw(seed, uid.epoch, uid.position, item.key), retired_share=retired_share)
        if not isinstance(decision, Decision):
            raise TypeError(f"schedule {self.schedule.name!r} returned {decision!r} from decide, expected a Decision")
        if decision.record is not None:
            history.put(item.key, decision.record)
        return decision.skip

    def _shares_at(self, uid: Uid) -> dict[str, float] | None:
        """The member shares in effect at ``uid`` (None: no weights set)."""
        shares = None
        for start, value in self._weights:
            if start > uid:
                break
            shares = value
        return shares

    def _member(self, item: Item) -> MemberCounts | None:
        name = member_name(item)
        return None if name is None else self._members.setdefault(name, MemberCounts())

    def _hand_out(self, uid: Uid) -> TakenPrompt:
        counts = self._counts(uid.epoch)
        if uid >= self._frontier:
            counts.taken += 1
            self._frontier = Uid(uid.epoch, uid.position + 1)
            member = self._member(self._items[uid])
            if member is not None:
                member.taken += 1
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
            self._history.observe(item.key, outcome)
            name = member_name(item) or ""
            self._events["outcomes", name] += 1
            self._events["zero_spread", name] += int(outcome.zero_spread)
            self._events["generated", name] += outcome.samples
            member = self._member(item)
            if member is not None:
                member.outcomes += 1
                member.pass_rate_sum += outcome.pass_rate
                member.generated += outcome.samples
                member.zero_spread += int(outcome.zero_spread)

    @staticmethod
    def _checked_outcomes(uids: list[Uid], outcomes: Sequence[Any] | None, action: str) -> list[Outcome | None]:
        if outcomes is None:
            return [None] * len(uids)
        outcomes = list(outcomes)
        if len(outcomes) != len(uids):
            raise ValueError(f"{action} got {len(uids)} uids and {len(outcomes)} outcomes; give one outcome (or None) per uid")
        for outcome in outcomes:
            if outcome is not None and not isinstance(outcome, Outcome):
                raise ValueError(
                    f"{action} got {outcome!r} as an outcome, expected rl_data.Outcome or None; build one with "
                    "Outcome(samples, correct=...) or Outcome.from_rewards(rewards)"
                )
        return outcomes

    def _give_back(self, uids: list[Uid]) -> None:
        for uid in uids:
            self._state[uid] = RELEASED
            self._outstanding -= 1
            heapq.heappush(self._released, uid)
            self._counts(uid.epoch).released += 1

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
        counts = self._counts(epoch)
        if counts.size is not None and counts.size != size:
            raise ValueError(
                f"epoch {epoch} had {counts.size} prompts when the checkpoint was saved and has {size} "
                "after the restore; expected the same: the producers are not deterministic or not "
                "built over the same data"
            )
        counts.size = size

    def _counts(self, epoch: int) -> EpochCounts:
        return self._epochs.setdefault(epoch, EpochCounts())

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
        size = self._epochs[uid.epoch].size if uid.epoch in self._epochs else None
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

    def _checked_state(self, state: Any) -> "CheckedState":
        adaptive = isinstance(state, dict) and self.KEY_SCHEDULE in state
        fields = self.STATE_KEYS + (self.ADAPTIVE_KEYS if adaptive else ())
        state = open_envelope(state, fmt=self.STATE_FORMAT, version=self.STATE_VERSION, what="prompt ledger", fields=fields)
        count = len(self._stream.producers)
        producers = state[self.KEY_PRODUCERS]
        if not isinstance(producers, list) or len(producers) != count:
            found = len(producers) if isinstance(producers, list) else type(producers).__name__
            raise ValueError(
                f"prompt ledger checkpoint holds {found} producer states, this ledger has {count} "
                "producers; restore with the producers the checkpoint was saved with"
            )
        cursor = Cursor.from_json(state[self.KEY_CURSOR], producers=count)
        saved = state[self.KEY_SCHEDULE] if adaptive else ScheduleConfig().describe()
        if saved != self.schedule.describe():
            raise ValueError(
                f"prompt ledger checkpoint was saved with another schedule: in checkpoint: {saved!r} / in this "
                f"feed: {self.schedule.describe()!r}; restore with the schedule it was saved with (FeedConfig.schedule)"
            )
        with collector_paused():
            acked, dropped, frontier = (
                [_uid(v) for v in state[self.KEY_ACKED]],
                [_uid(v) for v in state[self.KEY_DROPPED]],
                _uid(state[self.KEY_FRONTIER]),
            )
            skipped = [_uid(v) for v in state[self.KEY_SKIPPED]] if adaptive else []
        epochs = {}
        for entry in state[self.KEY_EPOCHS]:
            try:
                values = dict(entry)
                epoch = values.pop("epoch")
                epochs[epoch] = EpochCounts(**values)
            except (TypeError, ValueError, KeyError):
                fields = ["epoch", *EpochCounts.__dataclass_fields__]
                raise ValueError(
                    f"prompt ledger checkpoint holds epoch counts {entry!r}, expected a mapping with keys "
                    f"{fields}; it was not saved by this rl_data version"
                ) from None
        history, members, weights = PromptHistory(), {}, []
        if adaptive:
            saved = state[self.KEY_HISTORY]
            history = PromptHistory() if saved is None else PromptHistory.from_state(saved)
            try:
                members = {str(name): MemberCounts(**counts) for name, counts in state[self.KEY_MEMBERS].items()}
                weights = [(_uid([epoch, position]), dict(shares)) for epoch, position, shares in state[self.KEY_WEIGHTS]]
            except (TypeError, ValueError, AttributeError):
                raise ValueError(
                    "prompt ledger checkpoint holds malformed member counts or member weights; it was not saved by "
                    "this rl_data version"
                ) from None
        return CheckedState(producers, cursor, acked, dropped, skipped, frontier, epochs, history, members, weights)


@dataclass(frozen=True)
class CheckedState:
    """A ledger checkpoint, checked and parsed."""

    producers: list[Any]
    cursor: Cursor
    acked: list[Uid]
    dropped: list[Uid]
    skipped: list[Uid]
    frontier: Uid
    epochs: dict[int, EpochCounts]
    history: PromptHistory
    members: dict[str, MemberCounts]
    weights: list[tuple[Uid, dict[str, float]]]


def member_name(item: Item) -> str | None:
    """The mixture member of a prompt (its ``source_datasets`` column), None outside a mixture."""
    payload = item.payload
    name = payload.get("source_datasets") if isinstance(payload, dict) else None
    return name if isinstance(name, str) else None


def member_json(counts: MemberCounts) -> dict[str, Any]:
    return {"taken": counts.taken, "skipped": dict(counts.skipped), "outcomes": counts.outcomes,
            "pass_rate_sum": counts.pass_rate_sum, "generated": counts.generated, "zero_spread": counts.zero_spread}  # fmt: skip


def member_summary(counts: MemberCounts) -> dict[str, Any]:
    """A member's counters with its mean pass rate and generations per group with a reward spread."""
    useful = counts.outcomes - counts.zero_spread
    return {
        **member_json(counts),
        "pass_rate": counts.pass_rate_sum / counts.outcomes if counts.outcomes else None,
        "generated_per_useful_group": counts.generated / useful if useful else None,
    }


def _uid(value: Any) -> Uid:
    if not isinstance(value, list) or len(value) != 2 or any(type(v) is not int or v < 0 for v in value):
        raise ValueError(f"prompt ledger checkpoint holds {value!r} as a uid, expected [epoch, position]")
    return Uid(*value)
