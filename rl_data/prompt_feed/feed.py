"""``PromptFeed``: the async-RL prompt feed as a named Ray actor, exactly once per prompt.

The feed owns one rank actor per logical rank (``RuntimeConfig.world_size``, each in its
placement-group bundle, as the data coordinator places them), each reading the ``rl_prompt``
task in exact passes; their prompts are merged in a fixed order
(:class:`~rl_data.prompt_feed.MergedStream`, one :class:`~rl_data.prompt_feed.producers.RankProducer`
per rank) and one :class:`~rl_data.prompt_feed.ledger.PromptLedger` keeps the books. The semantics are
the ledger's (see :mod:`rl_data.prompt_feed.ledger`):

* prompt ``uid = (epoch, position)``; ``take(n)`` hands out released prompts first, then new
  ones, in uid order; each is outstanding until ``ack`` (trained), ``drop(reason)`` (consumed
  without training) or ``release`` (handed out again, same uid and payload), in any order;
  resolving a uid that is not outstanding raises ``UidStateError`` naming it;
* at most ``FeedConfig.max_outstanding`` prompts are outstanding. ``take(n, wait_s)`` **waits** up
  to ``wait_s`` (default ``FeedConfig.take_wait_s``, 0 = never) until there is room for
  ``min(n, max_outstanding)`` prompts, then **returns as many as fit**, possibly fewer than n
  or none (the window stayed full). It never waits for data beyond the producers' own latency;
* the checkpoint (``save_checkpoint``) is the producers' state at the low-water mark plus the
  resolved uids above it; after ``load_checkpoint`` the feed hands out again every prompt
  unresolved at checkpoint time, in uid order, never a resolved one. Epochs are exact passes;
  a source in ``virtual`` mode (a mixture of datasets, which has no passes) is one endless
  epoch 0, and every uid ``(0, position)`` is still handed out, resolved and restored exactly once.

Runtime:

* Calls from any number of callers (rollout workers, a trainer) are serialised by one asyncio
  lock; ``take`` runs the ledger on a worker thread (producers fetch batches with ``ray.get``)
  so ``status`` answers meanwhile. The feed fetches every batch (it keeps payloads of
  unresolved prompts to hand them out again) and returns prompts by value.
* The rank actors are a :class:`~rl_data.distributed.rank_pool.RankPool`'s (as the data
  coordinator's). One that dies (or loses a batch) is replaced in its bundle and restored to its
  producer's position (the loader state before the batch it was reading): nothing is lost or
  repeated. After ``max_rank_restarts`` deaths of one rank, ``take`` raises ``RankFailedError``.
* The feed registers as ``config.name`` in ``config.namespace``; a config whose name was left at
  the coordinator's default (``rl_data_coordinator``) registers as :data:`DEFAULT_FEED_NAME`
  (``rl_data_prompt_feed``, what ``attach_feed`` looks for by default). The name is part of no
  identity or fingerprint: a checkpoint restores into a feed of any name.
* A ``take`` may name its ``holder`` (e.g. the rollout worker's name). The feed remembers which
  outstanding prompts each holder has, and ``release_holder(holder)`` releases all of them at
  once: what a supervisor calls when a worker died or was preempted, whose prompts nobody else
  knows. The prompts whose results the supervisor already has (``keep``) stay outstanding but
  are **held by nobody** from then on: only an explicit ``ack``, ``drop`` or ``release`` resolves
  them, so a restarted worker that takes under the same name (and is released again later)
  never gives them back. A ``take`` whose reply never reaches its caller leaves its prompts
  outstanding until they are released; ``status()`` shows the outstanding prompts per holder
  and the oldest hand-out's age (also a gauge).
* Checkpoints are written atomically with the project's checkpoint files on the feed's node
  and refuse another placement layout or loader identity (nothing is restored then), changed
  mixture weights included (the uids resolved above the low-water mark name prompts drawn with
  the saved weights): a feed changes its weights live instead, with ``set_member_weights``. A restore that fails part way refuses
  ``take`` until a restore succeeds.
* A restore works on a fresh feed (cheap: the rank actors load the states) and on a live one
  (a **rewind**, e.g. a trainer that crashed and resumes from its last checkpoint): once the
  checkpoint passed its checks, every outstanding, released and prefetched prompt is forgotten,
  every rank actor restores in place (a new loader in its own process, not a new actor, not a
  rank death), and the ledger is rebuilt from the checkpoint. Holders and hand-out times are forgotten: resolving
  a uid handed out before the rewind raises ``UidStateError`` until the feed hands it out again.
  One restore at a time: a second ``load_state_dict`` while one is in flight is refused.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Sequence

import ray
from pydantic import BaseModel, ConfigDict, Field

from rl_data.batched_data_dict import PooledList
from rl_data.config_blocks import ConfigError
from rl_data.distributed.checkpoint_files import (
    checkpoint_path,
    load_checkpoint_file,
    pickled_size,
    save_checkpoint_file,
)
from rl_data.distributed.config import DEFAULT_NAME, LoaderSpec, RuntimeConfig, start_problems
from rl_data.distributed.rank_pool import RankPool, holds_actor_name, spawn_rank_actor
from rl_data.prompt_feed.client import DEFAULT_FEED_NAME
from rl_data.prompt_feed.epoch_book import DEFAULT_KEPT_EPOCHS
from rl_data.prompt_feed.ledger import PromptLedger, TakenPrompt
from rl_data.prompt_feed.merge import Uid
from rl_data.prompt_feed.metrics import FeedMetrics
from rl_data.prompt_feed.outcomes import Outcome
from rl_data.prompt_feed.producers import RankProducer, check_producer_state
from rl_data.prompt_feed.schedules import ScheduleConfig
from rl_data.stateful import envelope, open_envelope

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_FORMAT_VERSION",
    "DEFAULT_FEED_NAME",
    "FeedConfig",
    "PromptFeed",
    "check_prompt_spec",
    "feed_runtime_config",
    "holds_actor_name",
    "member_shares",
    "new_ledger",
    "prompt_spec_problems",
    "spawn_rank_actor",
    "start_prompt_feed",
]

CHECKPOINT_FORMAT = "rl_data.prompt_feed"
CHECKPOINT_FORMAT_VERSION = 1
PROMPT_TASK = "rl_prompt"
#: Seconds between two updates of the age gauge.
GAUGE_PERIOD_S = 1.0
#: Ends the refusal of a checkpoint whose only identity changes are mixture weights.
FEED_REWEIGHT_HINT = (
    "; only mixture weights changed: a prompt feed restores only into the mixture it was saved with "
    "(the uids it resolved above the checkpoint's low-water mark name prompts drawn with the saved "
    "weights); restore with the weights the checkpoint was saved with, then change them live with "
    "set_member_weights"
)


class FeedConfig(BaseModel):
    """The feed's window (``max_outstanding`` prompts at most; ``take`` waits ``take_wait_s`` by
    default) and its ``schedule`` (which prompts it hands out, from their outcomes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_outstanding: int = Field(ge=1, description="Prompts handed out and not yet acked, dropped or released, at most.")
    take_wait_s: float = Field(
        default=0.0, ge=0, description="Seconds take waits by default for room in the window (0: never waits)."
    )
    kept_epochs: int = Field(
        default=DEFAULT_KEPT_EPOCHS, ge=1,
        description="Ended epochs that status() and the checkpoint count one by one; older resolved ones are summed "
        "(earlier_epochs), so both stay bounded however many epochs a run reads.",
    )
    schedule: ScheduleConfig = Field(
        default_factory=ScheduleConfig,
        description="Which prompts each epoch hands out, from their outcomes: 'uniform' (all), 'difficulty_filter', "
        "'prioritized' or a class by import path.",
    )


def prompt_spec_problems(spec: LoaderSpec) -> list[str]:
    """What a prompt feed refuses in ``spec`` ([]: nothing): a task whose batches are not prompts
    (``rl_prompt``, or another task with ``Task.prompt_batches``), a validation split, or exact
    passes cut into loops (epoch e must be pass e; ``virtual`` mode is one endless epoch 0, what a
    mixture of datasets gives)."""
    problems = []
    task = spec.data_config.energon.task
    if task != PROMPT_TASK and not spec.task().prompt_batches:  # rl_prompt: no import here
        problems.append(
            f"data_config['energon']['task'] is {task!r}, a task whose batches are not prompts "
            f"(Task.prompt_batches is False), expected {PROMPT_TASK!r}; set it to {PROMPT_TASK!r} (or a task with prompt batches)"
        )
    if spec.split_role != "train":
        problems.append(
            f"split_role is {spec.split_role!r}, expected 'train': a feed hands out training prompts; set split_role 'train'"
        )
    if spec.source.epoch_mode == "exact" and spec.source.virtual_epoch_length != 0:
        problems.append(
            f"source has epoch_mode 'exact' and virtual_epoch_length {spec.source.virtual_epoch_length}, "
            "expected 0 (one pass per epoch), or epoch_mode 'virtual' (one endless epoch); set one of them"
        )
    return problems


def member_shares(spec: LoaderSpec, weights: dict[str, float]) -> dict[str, float]:
    """Each mixture member's hand-out probability that turns the mixture's weights into ``weights``
    (see ``PromptFeed.set_member_weights``); ``ValueError`` naming what is wrong."""
    from rl_data.energon.mixture import mixture_members

    members = mixture_members(spec.source)
    if not members or any("weight" not in m for m in members.values()):
        raise ValueError(
            f"set_member_weights needs a feed over a mixture of datasets; this feed reads {spec.source.describe()!r}"
        )
    unknown = sorted(set(weights) - set(members))
    if unknown:
        raise ValueError(f"member weights name {unknown}, not members of the mixture; its members are {sorted(members)}")
    bad = {m: w for m, w in weights.items() if not isinstance(w, (int, float)) or isinstance(w, bool) or w < 0}
    if bad:
        raise ValueError(f"member weights must be numbers >= 0, found {bad}")
    base = {name: float(m["weight"]) for name, m in members.items()}
    target = base | {m: float(w) for m, w in weights.items()}
    raised = sorted(m for m in members if base[m] == 0 and target[m] > 0)
    if raised or not any(target.values()):
        raise ValueError(
            f"member weights {target} cannot be served: "
            + (f"{raised} have weight 0 in the mixture and the feed can only thin members; give them a weight there"
               if raised else "every weight is 0; give one member a weight > 0")
        )  # fmt: skip
    total_base, total_target = sum(base.values()), sum(target.values())
    ratio = {m: (target[m] / total_target) / (base[m] / total_base) if base[m] else 0.0 for m in members}
    top = max(ratio.values())
    return {m: r / top for m, r in ratio.items()}


def new_ledger(producers: Sequence[Any], feed_config: FeedConfig, spec: LoaderSpec) -> PromptLedger:
    """A ledger over ``producers`` with the feed's window, schedule and planned member weights."""
    schedule = feed_config.schedule
    mixture = bool(schedule.reweight_every or schedule.member_weights)
    ledger = PromptLedger(
        producers, max_outstanding=feed_config.max_outstanding, schedule=schedule,
        weight_shares=functools.partial(member_shares, spec) if mixture else None, kept_epochs=feed_config.kept_epochs,
    )  # fmt: skip
    for change in schedule.member_weights:
        ledger.set_member_weights(member_shares(spec, change.weights), at=change.at)
    return ledger


def check_prompt_spec(spec: LoaderSpec) -> None:
    """Refuse a loader spec that a prompt feed cannot serve (:func:`prompt_spec_problems`) with one
    :class:`~rl_data.config_blocks.ConfigError`."""
    problems = prompt_spec_problems(spec)
    if problems:
        raise ConfigError("a prompt feed needs RL prompts in exact passes or one endless epoch", problems)


def feed_runtime_config(config: RuntimeConfig) -> RuntimeConfig:
    """``config`` as a feed runs it: a name left at the coordinator's default becomes :data:`DEFAULT_FEED_NAME`."""
    return config.model_copy(update={"name": DEFAULT_FEED_NAME}) if config.name == DEFAULT_NAME else config


def oldest_age(handed_at: dict[Uid, float]) -> float:
    """Seconds since the oldest outstanding hand-out in ``handed_at`` (oldest first), 0 with none."""
    return round(time.monotonic() - next(iter(handed_at.values())), 3) if handed_at else 0.0


class PromptFeed:
    """Serves RL prompts exactly once each to concurrent callers from a :class:`RankPool` (run as a named Ray actor)."""

    STATE_FORMAT, STATE_VERSION = CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_VERSION  # (rl_data.stateful)

    def __init__(
        self,
        config: RuntimeConfig,
        loader_spec: LoaderSpec,
        feed_config: FeedConfig,
        placement_group: Any = None,
        bundle_of_rank: Optional[Sequence[int]] = None,
    ) -> None:
        check_prompt_spec(loader_spec)
        config = feed_runtime_config(config)
        self._config, self._feed_config, self._loader_spec = config, feed_config, loader_spec
        self._metrics = FeedMetrics(config.name)
        self._pool = RankPool(config, loader_spec, owner="feed", placement_group=placement_group, bundle_of_rank=bundle_of_rank)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prompt-feed")
        self._changed = asyncio.Condition()  # its lock serialises every ledger call
        self._producers: list[RankProducer] = []
        self._ledger: Optional[PromptLedger] = None
        self._fresh_ranks = True  # no rank actor produced a batch (no take since they were spawned)
        self._handed_at: dict[Uid, float] = {}  # outstanding uid -> when handed out, oldest first
        self._holder_of: dict[Uid, str] = {}  # outstanding uid -> the holder named in its take
        self._totals = {"taken": 0, "acked": 0, "dropped": 0, "released": 0}
        self._summary: dict[str, Any] = {}
        self._gauges: Optional[asyncio.Task] = None

    async def ready(self) -> dict[str, Any]:
        """Wait for the placement group and every rank's loader; return :meth:`status`."""
        await self._ensure_ready()
        return await self.status()

    async def take(self, n: int, wait_s: Optional[float] = None, holder: Optional[str] = None) -> list[TakenPrompt]:
        """Up to ``n`` prompts (see the module doc: waits up to ``wait_s`` for room, returns what
        fits), recorded as held by ``holder`` when given (see :meth:`release_holder`)."""
        if type(n) is not int or n < 0:
            raise ValueError(f"take(n) needs an int n >= 0, found {n!r}")
        if holder is not None and (not isinstance(holder, str) or not holder):
            raise ValueError(f"take holder must be a non-empty string (e.g. the worker's name) or None, found {holder!r}")
        wait = self._feed_config.take_wait_s if wait_s is None else float(wait_s)
        if wait < 0:
            raise ValueError(f"take wait_s must be >= 0 seconds, found {wait_s!r}")
        await self._ensure_ready()
        want = min(n, self._feed_config.max_outstanding)
        async with self._changed:
            self._pool.refuse_if_restore_failed("take")
            if wait > 0:
                try:
                    await asyncio.wait_for(
                        self._changed.wait_for(lambda: self._ledger.max_outstanding - self._ledger.outstanding >= want),
                        wait,
                    )
                except asyncio.TimeoutError:
                    pass  # the lock is held again: take what fits
            self._pool.refuse_if_restore_failed("take")
            self._fresh_ranks = False
            taken = PooledList(await self._in_thread(self._ledger.take, n))
            now = time.monotonic()
            for prompt in taken:
                self._handed_at[prompt.uid] = now
                if holder is not None:
                    self._holder_of[prompt.uid] = holder
            self._totals["taken"] += len(taken)
            self._metrics.record_taken(len(taken))
            self._record_levels()
        return taken

    async def ack(self, uids: Sequence[Any], outcomes: Optional[Sequence[Optional[Outcome]]] = None) -> None:
        """Outstanding prompts were trained; ``outcomes``: an ``Outcome`` (or None) per uid, for the schedule."""
        uids = list(uids)
        await self._resolve("ack", lambda: self._ledger.ack(uids, outcomes), uids, "acked")
        self._metrics.record_acked(len(uids))

    async def drop(self, uids: Sequence[Any], reason: str, outcomes: Optional[Sequence[Optional[Outcome]]] = None) -> None:
        """Outstanding prompts were consumed without training (counted under ``reason``); ``outcomes`` as in :meth:`ack`."""
        uids = list(uids)
        await self._resolve("drop", lambda: self._ledger.drop(uids, reason, outcomes), uids, "dropped")
        self._metrics.record_dropped(len(uids), reason)

    async def set_member_weights(self, weights: dict[str, float], at: Optional[Sequence[int]] = None) -> list[int]:
        """New mixture member weights from uid ``at`` on (default: the next prompt reached); returns that uid.
        ``weights``: member name -> weight, relative, as in the mixture (others keep theirs); the feed
        thins each member's prompts to match (:func:`member_shares`; skips counted as ``member_weight``),
        recorded in the checkpoint.
        """
        shares = member_shares(self._loader_spec, weights)
        await self._ensure_ready()
        async with self._changed:
            self._pool.refuse_if_restore_failed("set_member_weights")
            return list(self._ledger.set_member_weights(shares, at))

    async def release(self, uids: Sequence[Any]) -> None:
        """Give outstanding prompts back: handed out again, before new ones, same uid and payload."""
        uids = list(uids)
        await self._resolve("release", lambda: self._ledger.release(uids), uids, "released")
        self._metrics.record_released(len(uids))

    async def release_holder(self, holder: str, keep: Sequence[Any] = ()) -> list[Uid]:
        """Release every outstanding prompt taken by ``holder`` (a dead or preempted worker) except
        those in ``keep``; return the released uids.

        ``keep``: the prompts whose results already reached the caller (e.g. groups the worker
        returned that wait in the trainer's buffer): they stay outstanding and are held by nobody
        from now on, to be acked, dropped or released explicitly (a later ``release_holder`` of
        the same name, e.g. for a restarted worker, does not release them).
        """
        kept = {Uid(*uid) for uid in keep}
        await self._ensure_ready()
        async with self._changed:
            self._pool.refuse_if_restore_failed("release_holder")
            held = sorted(uid for uid, owner in self._holder_of.items() if owner == holder)
            uids = [uid for uid in held if uid not in kept]
            self._ledger.release(uids)
            self._forget(uids)
            for uid in held:  # the kept ones stay outstanding, held by nobody
                self._holder_of.pop(uid, None)
            self._totals["released"] += len(uids)
            self._record_levels()
            self._changed.notify_all()
        self._metrics.record_released(len(uids))
        return uids

    async def status(self) -> dict[str, Any]:
        """The ledger's summary, the window, restarts and what every rank is doing.

        Answers while a ``take`` fetches batches (then the summary is the one after the last
        finished call, and ``busy`` is True).
        """
        busy = self._changed.locked()
        if not busy and self._ledger is not None:
            self._summary = self._ledger.summary()
        ranks = await self._pool.status()  # placement_fingerprint, restarts, restore_failure, rank_actor_names, ranks
        return {
            **self._summary,
            **ranks,
            "busy": busy,
            "pid": os.getpid(),
            "max_outstanding": self._feed_config.max_outstanding,
            "oldest_outstanding_age_s": oldest_age(self._handed_at),
            "outstanding_by_holder": dict(Counter(self._holder_of.values())),
            "totals": dict(self._totals),
        }

    async def state_dict(self) -> dict[str, Any]:
        """The checkpoint (loads with ``torch.load(weights_only=True)``)."""
        await self._ensure_ready()
        async with self._changed:
            self._pool.refuse_if_restore_failed("state_dict")
            started, placement = time.monotonic(), self._pool.placement
            state = envelope(self.STATE_FORMAT, self.STATE_VERSION, {
                "placement": {"fingerprint": placement.fingerprint, "layout": placement.layout},
                "ledger": self._ledger.state_dict(),
            })
            self._metrics.record_checkpoint(time.monotonic() - started, pickled_size(state))
            return state

    async def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint, all or nothing, into a fresh feed or a live one (a rewind, see the module doc).

        Refuses (``ValueError``, nothing changed: a live feed keeps serving) another format,
        placement layout or loader identity (changed mixture weights too), or a malformed
        checkpoint; refuses (``RuntimeError``) a call while another restore of this feed is in
        flight. If restoring the ranks fails part way, ``take`` and the resolving calls are
        refused until a restore succeeds.
        """
        with self._pool.restore_slot("load_state_dict"):
            await self._restore(state)

    async def _restore(self, state: dict[str, Any]) -> None:
        await self._ensure_ready()
        async with self._changed:
            self._check_checkpoint(state)
            rewind = not self._fresh_ranks
            self._fresh_ranks = False  # no rank state is trusted until a restore succeeds
            with self._pool.restoring("a checkpoint"):
                if rewind:
                    self._renew_producers()
                ledger = new_ledger(self._producers, self._feed_config, self._loader_spec)
                await self._in_thread(ledger.load_state_dict, state["ledger"])
            self._fresh_ranks = True  # restored, nothing produced yet
            self._ledger = ledger
            self._summary = ledger.summary()
            self._handed_at.clear()
            self._holder_of.clear()
            self._metrics.record_restore("rewind" if rewind else "checkpoint")
            self._record_levels()
            self._changed.notify_all()  # takes waiting for room see the emptied window

    async def save_checkpoint(self, directory: str) -> str:
        """Write :meth:`state_dict` atomically to ``directory`` (on this actor's node); return the file."""
        state = await self.state_dict()
        return str(await asyncio.get_running_loop().run_in_executor(None, save_checkpoint_file, checkpoint_path(directory), state))

    async def load_checkpoint(self, directory: str) -> dict[str, Any]:
        """Load a checkpoint written by :meth:`save_checkpoint` (into a fresh or a live feed, as
        :meth:`load_state_dict`); return the restored ledger summary."""
        with self._pool.restore_slot("load_checkpoint"):
            path = checkpoint_path(directory)
            state = await asyncio.get_running_loop().run_in_executor(None, load_checkpoint_file, path)
            await self._restore(state)
            return dict(self._summary)

    async def shutdown(self) -> None:
        """Kill the rank actors and remove the placement group if this feed made it."""
        if self._gauges is not None:
            self._gauges.cancel()
        self._pool.shutdown()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _ensure_ready(self) -> None:
        """Once: wait for the ranks (bundles and initial loader states); build the ledger."""
        if self._ledger is not None:
            return
        states = await self._pool.ready()
        if self._ledger is None:  # a concurrent call may have built it
            self._producers = [self._producer(rank, state) for rank, state in enumerate(states)]
            self._ledger = new_ledger(self._producers, self._feed_config, self._loader_spec)
            self._summary = self._ledger.summary()
            self._gauges = asyncio.get_running_loop().create_task(self._update_gauges())

    async def _resolve(self, action: str, call: Any, uids: list[Any], total: str) -> None:
        """Run the ledger's ``action`` (all or nothing), forget the uids' hand-out times, wake waiting takes."""
        await self._ensure_ready()
        async with self._changed:
            self._pool.refuse_if_restore_failed(action)
            call()
            self._forget(Uid(*uid) for uid in uids)
            self._totals[total] += len(uids)
            self._record_levels()
            self._changed.notify_all()

    def _forget(self, uids: Any) -> None:
        """Drop the hand-out time and holder of uids that are no longer outstanding."""
        for uid in uids:
            self._handed_at.pop(uid, None)
            self._holder_of.pop(uid, None)

    async def _in_thread(self, function: Any, *args: Any) -> Any:
        """Run a ledger call on the feed's one worker thread; the caller holds the lock."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    def _record_levels(self) -> None:
        """Set the gauges and count the ledger's events; call with the lock held (or when nothing runs on the worker thread)."""
        ledger = self._ledger
        self._metrics.record_curation(ledger.curator.pop_events(), ledger.curator.member_pass_rates)
        history = ledger.curator.history
        self._metrics.record_levels(
            outstanding=ledger.outstanding, oldest_age_s=oldest_age(self._handed_at), low_water_mark=tuple(ledger.low_water_mark),
            epoch=ledger.epoch, retired=history.retired, deferred=history.deferred,
        )  # fmt: skip

    async def _update_gauges(self) -> None:
        while True:
            await asyncio.sleep(GAUGE_PERIOD_S)
            if not self._changed.locked():
                self._record_levels()

    def _check_checkpoint(self, state: Any) -> None:
        """Refuse a checkpoint of another format, layout or loader identity (nothing is changed)."""
        open_envelope(state, fmt=self.STATE_FORMAT, version=self.STATE_VERSION, what="prompt feed")
        placement, ledger = state.get("placement"), state.get("ledger")
        producers = ledger.get("producers") if isinstance(ledger, dict) else None
        if (
            not isinstance(placement, dict)
            or not isinstance(placement.get("layout"), dict)
            or not isinstance(producers, list)
            or not all(isinstance(p, dict) and isinstance(p.get("loader"), dict) for p in producers)
        ):
            raise ValueError(
                "prompt feed checkpoint is malformed: expected {'placement': {'layout', ...}, 'ledger': "
                "{'producers': [{'loader': ...}, ...], ...}}; it was not written by save_checkpoint of "
                "this version, restore from another checkpoint"
            )
        identities = [saved["loader"].get("identity") for saved in producers]
        self._pool.check_checkpoint(placement["layout"], identities, reweight_hint=FEED_REWEIGHT_HINT)
        for rank, saved in enumerate(producers):
            check_producer_state(rank, saved)
        self._ledger.check_state_dict(ledger)

    def _renew_producers(self) -> None:
        """A rewind: fresh producers over the same rank actors (each restores in place when the
        ledger loads the checkpoint: ``RankActor.load_state_dict`` rebuilds its loader)."""
        self._producers = [self._producer(rank, state) for rank, state in enumerate(self._pool.initial_states)]

    def _replace(self, rank: int, cause: BaseException) -> Any:
        """Count rank's death and start a fresh actor in its bundle (the producer restores it); on the worker thread."""
        actor = self._pool.replace(rank, cause, "serving prompts")
        self._metrics.record_restore("rank_recovery")
        return actor

    def _producer(self, rank: int, initial_state: dict[str, Any]) -> RankProducer:
        return RankProducer(
            rank, self._pool.actors[rank], initial_state, replace=self._replace,
            batch_timeout_s=self._config.step_timeout_s, control_timeout_s=self._config.control_timeout_s,
        )  # fmt: skip


def start_prompt_feed(
    config: RuntimeConfig,
    loader_spec: LoaderSpec,
    feed_config: FeedConfig,
    *,
    placement_group: Any = None,
    bundle_of_rank: Optional[Sequence[int]] = None,
    check_datasets: bool = True,
) -> Any:
    """Create the named feed actor (``config.name``, or :data:`DEFAULT_FEED_NAME` when it was left
    at the coordinator's default, in ``config.namespace``), wait until every rank is ready.

    First, on the driver, before any actor or placement group starts: every problem of the
    arguments, the datasets' metadata, the processor factory (``start_problems``) and what a feed
    cannot serve (:func:`prompt_spec_problems`) is raised as one :class:`~rl_data.config_blocks.ConfigError`.

    ``check_datasets=False`` skips the dataset checks, for a driver that cannot read the datasets
    (e.g. a head node without the shared mount the rank actors read): a rank then refuses a bad
    path when it builds its loader.
    """
    problems = start_problems(
        config, loader_spec, placement_group=placement_group, bundle_of_rank=bundle_of_rank, check_datasets=check_datasets
    )
    if isinstance(loader_spec, LoaderSpec):
        problems += prompt_spec_problems(loader_spec)
    if not isinstance(feed_config, FeedConfig):
        problems.append(f"feed_config is a {type(feed_config).__name__}, expected a FeedConfig; build one with FeedConfig(...)")
    else:
        try:
            feed_config.schedule.build()
            for change in feed_config.schedule.member_weights:
                if isinstance(loader_spec, LoaderSpec):
                    member_shares(loader_spec, change.weights)
            if feed_config.schedule.reweight_every and isinstance(loader_spec, LoaderSpec):
                member_shares(loader_spec, {})  # refuses a feed over one dataset
        except ValueError as error:
            problems.append(f"feed_config.schedule: {error}")
    if problems:
        name = feed_runtime_config(config).name if isinstance(config, RuntimeConfig) else DEFAULT_FEED_NAME
        raise ConfigError(f"prompt feed {name!r} was not started", problems)
    config = feed_runtime_config(config)
    handle = (
        ray.remote(PromptFeed)
        .options(name=config.name, namespace=config.namespace, num_cpus=0, max_restarts=0, lifetime=config.lifetime)
        .remote(config, loader_spec, feed_config, placement_group, bundle_of_rank)
    )
    try:
        ray.get(handle.ready.remote(), timeout=config.control_timeout_s + 30)
    except BaseException:
        ray.kill(handle, no_restart=True)
        raise
    return handle
