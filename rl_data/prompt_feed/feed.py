"""``PromptFeed``: the async-RL prompt feed as a named Ray actor, exactly once per prompt.

The feed owns one rank actor per logical rank (``RuntimeConfig.world_size``, each in its
placement-group bundle, as the data coordinator places them), each reading the ``rl_prompt``
task in exact passes; their prompts are merged in a fixed order
(:class:`~rl_data.prompt_feed.MergedStream`, one :class:`~rl_data.prompt_feed.producers.RankProducer`
per rank) and one :class:`~rl_data.prompt_feed.PromptLedger` keeps the books. The semantics are
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
* A rank actor that dies (or loses a batch) is replaced in its bundle and restored to its
  producer's position (the loader state before the batch it was reading): nothing is lost or
  repeated. After ``max_rank_restarts`` deaths of one rank, ``take`` raises ``RankFailedError``.
* A ``take`` may name its ``holder`` (e.g. the rollout worker's name). The feed remembers which
  outstanding prompts each holder has, and ``release_holder(holder)`` releases all of them at
  once: what a supervisor calls when a worker died or was preempted, whose prompts nobody else
  knows (minus the prompts whose results the supervisor already has: ``keep``). A ``take``
  whose reply never reaches its caller leaves its prompts outstanding until
  they are released; ``status()`` shows the outstanding prompts per holder and the oldest
  hand-out's age (also a gauge).
* Checkpoints are written atomically with the project's checkpoint files on the feed's node
  and refuse another placement layout or loader identity (nothing is restored then). A restore
  that fails part way refuses ``take`` until a restore succeeds.
* A restore works on a fresh feed (cheap: the rank actors load the states) and on a live one
  (a **rewind**, e.g. a trainer that crashed and resumes from its last checkpoint): once the
  checkpoint passed its checks, every outstanding, released and prefetched prompt is forgotten,
  every rank actor is replaced by a fresh one in its bundle (not counted as a rank death), and
  the ledger is rebuilt from the checkpoint. Holders and hand-out times are forgotten: resolving
  a uid handed out before the rewind raises ``UidStateError`` until the feed hands it out again.
  One restore at a time: a second ``load_state_dict`` while one is in flight is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Sequence

import ray
from pydantic import BaseModel, ConfigDict, Field
from ray.exceptions import RayActorError

from rl_data.batched_data_dict import PooledList
from rl_data.distributed.checkpoint_files import (
    check_content_format,
    checkpoint_path,
    load_checkpoint_file,
    save_checkpoint_file,
)
from rl_data.distributed.config import LoaderSpec, RuntimeConfig
from rl_data.distributed.coordinator import (
    RankTimeoutError,
    count_rank_death,
    layout_fix,
    refuse_if_restore_failed,
)
from rl_data.distributed.placement import (
    RankPlacement,
    adopt_placement_group,
    create_rank_placement,
    remove_leftover_placement_group,
)
from rl_data.distributed.rank_actor import RankActor
from rl_data.prompt_feed.ledger import PromptLedger, TakenPrompt
from rl_data.prompt_feed.merge import Uid
from rl_data.prompt_feed.metrics import FeedMetrics
from rl_data.prompt_feed.producers import RankProducer, check_producer_state

CHECKPOINT_FORMAT = "rl_data.prompt_feed"
CHECKPOINT_FORMAT_VERSION = 1
PROMPT_TASK = "rl_prompt"
#: Seconds between two updates of the age gauge.
GAUGE_PERIOD_S = 1.0


class FeedConfig(BaseModel):
    """The feed's window: ``max_outstanding`` prompts at most; ``take`` waits ``take_wait_s`` by default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_outstanding: int = Field(ge=1)
    take_wait_s: float = Field(default=0.0, ge=0)


def check_prompt_spec(spec: LoaderSpec) -> None:
    """Refuse a loader that does not read ``rl_prompt`` training data in exact passes (epoch e =
    pass e) or in ``virtual`` mode (one endless epoch 0: what a mixture of datasets gives)."""
    problems = []
    if spec.data_config.energon.task_encoder != PROMPT_TASK:
        problems.append(f"data_config.energon.task_encoder is {spec.data_config.energon.task_encoder!r}, expected {PROMPT_TASK!r}")
    if spec.split_role != "train":
        problems.append(f"split_role is {spec.split_role!r}, expected 'train'")
    if spec.source.epoch_mode == "exact" and spec.source.virtual_epoch_length != 0:
        problems.append(
            f"source has epoch_mode 'exact' and virtual_epoch_length {spec.source.virtual_epoch_length}, "
            "expected 0 (one pass per epoch), or epoch_mode 'virtual' (one endless epoch)"
        )
    if problems:
        raise ValueError("a prompt feed needs RL prompts in exact passes or one endless epoch: " + "; ".join(problems))


def holds_actor_name(name: str, namespace: str) -> bool:
    """Whether the calling actor is the one registered as ``name`` in ``namespace``."""
    try:
        holder = ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    return holder._actor_id.hex() == ray.get_runtime_context().get_actor_id()


def spawn_rank_actor(
    config: RuntimeConfig, spec: LoaderSpec, placement: RankPlacement, rank: int, actor_name: str
) -> Any:
    """A new :class:`RankActor` for ``rank`` in its bundle, named ``actor_name`` (nothing restored).

    Its metrics are tagged ``coordinator=config.name``.
    """
    return (
        ray.remote(RankActor)
        .options(
            name=actor_name,
            namespace=config.namespace,
            num_cpus=config.rank_actor_num_cpus,
            scheduling_strategy=placement.scheduling_strategy(rank),
            max_restarts=0,
        )
        .remote(
            rank=rank,
            world_size=config.world_size,
            placement_fingerprint=placement.fingerprint,
            loader_spec=spec,
            prefetch_depth=config.prefetch_depth,
            injected_delay_s=config.injected_delay_s.get(rank, 0.0),
            coordinator_name=config.name,
        )
    )


class PromptFeed:
    """Serves RL prompts exactly once each to concurrent callers (run as a named Ray actor)."""

    def __init__(
        self,
        config: RuntimeConfig,
        loader_spec: LoaderSpec,
        feed_config: FeedConfig,
        placement_group: Any = None,
        bundle_of_rank: Optional[Sequence[int]] = None,
    ) -> None:
        check_prompt_spec(loader_spec)
        self._config, self._spec, self._feed_config = config, loader_spec, feed_config
        self._metrics = FeedMetrics(config.name)
        if placement_group is None:
            if holds_actor_name(config.name, config.namespace):
                remove_leftover_placement_group(config)
            self._placement = create_rank_placement(config)
        else:
            self._placement = adopt_placement_group(placement_group, bundle_of_rank or (), config)
        self._instance = os.urandom(3).hex()
        self._rewinds = 0  # rank actors replaced by a rewind (part of their names)
        self._restarts = [0] * config.world_size
        self._ranks = [self._spawn(rank) for rank in range(config.world_size)]
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prompt-feed")
        self._changed = asyncio.Condition()  # its lock serialises every ledger call
        self._ready_lock = asyncio.Lock()
        self._initial_states: list[dict[str, Any]] = []
        self._producers: list[RankProducer] = []
        self._ledger: Optional[PromptLedger] = None
        self._fresh_ranks = True  # no rank actor produced a batch (no take since they were spawned)
        self._restoring = False  # a load_checkpoint/load_state_dict is in flight
        self._restore_failure: Optional[str] = None
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
            self._refuse_if_restore_failed("take")
            if wait > 0:
                try:
                    await asyncio.wait_for(
                        self._changed.wait_for(lambda: self._ledger.max_outstanding - self._ledger.outstanding >= want),
                        wait,
                    )
                except asyncio.TimeoutError:
                    pass  # the lock is held again: take what fits
            self._refuse_if_restore_failed("take")
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

    async def ack(self, uids: Sequence[Any]) -> None:
        """Outstanding prompts were trained."""
        uids = list(uids)
        await self._resolve("ack", lambda: self._ledger.ack(uids), uids, "acked")
        self._metrics.record_acked(len(uids))

    async def drop(self, uids: Sequence[Any], reason: str) -> None:
        """Outstanding prompts were consumed without training (counted under ``reason``)."""
        uids = list(uids)
        await self._resolve("drop", lambda: self._ledger.drop(uids, reason), uids, "dropped")
        self._metrics.record_dropped(len(uids), reason)

    async def release(self, uids: Sequence[Any]) -> None:
        """Give outstanding prompts back: handed out again, before new ones, same uid and payload."""
        uids = list(uids)
        await self._resolve("release", lambda: self._ledger.release(uids), uids, "released")
        self._metrics.record_released(len(uids))

    async def release_holder(self, holder: str, keep: Sequence[Any] = ()) -> list[Uid]:
        """Release every outstanding prompt taken by ``holder`` (a dead or preempted worker) except
        those in ``keep``; return the released uids.

        ``keep``: the prompts whose results already reached the caller (e.g. groups the worker
        returned that wait in the trainer's buffer): they stay outstanding, to be acked or dropped.
        """
        kept = {Uid(*uid) for uid in keep}
        await self._ensure_ready()
        async with self._changed:
            self._refuse_if_restore_failed("release_holder")
            uids = sorted(uid for uid, owner in self._holder_of.items() if owner == holder and uid not in kept)
            self._ledger.release(uids)
            self._forget(uids)
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
        ranks = []
        for rank, actor in enumerate(list(self._ranks)):
            try:
                ranks.append(await asyncio.wait_for(asyncio.wrap_future(actor.status.remote().future()), 10))
            except (asyncio.TimeoutError, RayActorError) as error:
                ranks.append({"rank": rank, "activity": f"not answering ({type(error).__name__})"})
        return {
            **self._summary,
            "busy": busy,
            "pid": os.getpid(),
            "max_outstanding": self._feed_config.max_outstanding,
            "oldest_outstanding_age_s": self._oldest_age(),
            "outstanding_by_holder": dict(Counter(self._holder_of.values())),
            "totals": dict(self._totals),
            "placement_fingerprint": self._placement.fingerprint,
            "restarts": list(self._restarts),
            "restore_failure": self._restore_failure,
            "rank_actor_names": [self._rank_actor_name(r) for r in range(len(self._ranks))],
            "ranks": ranks,
        }

    async def state_dict(self) -> dict[str, Any]:
        """The checkpoint (loads with ``torch.load(weights_only=True)``)."""
        await self._ensure_ready()
        async with self._changed:
            self._refuse_if_restore_failed("state_dict")
            return {
                "format": CHECKPOINT_FORMAT,
                "format_version": CHECKPOINT_FORMAT_VERSION,
                "placement": {"fingerprint": self._placement.fingerprint, "layout": self._placement.layout},
                "ledger": self._ledger.state_dict(),
            }

    async def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint, all or nothing, into a fresh feed or a live one (a rewind, see the module doc).

        Refuses (``ValueError``, nothing changed: a live feed keeps serving) another format,
        placement layout or loader identity, or a malformed checkpoint; refuses (``RuntimeError``)
        a call while another restore of this feed is in flight. If restoring the ranks fails
        part way, ``take`` and the resolving calls are refused until a restore succeeds.
        """
        with self._restore_slot():
            await self._restore(state)

    async def _restore(self, state: dict[str, Any]) -> None:
        await self._ensure_ready()
        async with self._changed:
            self._check_checkpoint(state)
            rewind = not self._fresh_ranks
            self._restore_failure = "restoring a checkpoint did not finish"
            try:
                if rewind:
                    self._respawn_ranks()
                ledger = PromptLedger(self._producers, max_outstanding=self._feed_config.max_outstanding)
                await self._in_thread(ledger.load_state_dict, state["ledger"])
            except BaseException as error:
                self._restore_failure = f"restoring a checkpoint failed: {error}"
                self._fresh_ranks = False  # respawn on the next attempt: no rank state is trusted
                raise
            self._restore_failure = None
            self._ledger = ledger
            self._summary = ledger.summary()
            self._handed_at.clear()
            self._holder_of.clear()
            self._metrics.record_restore("rewind" if rewind else "checkpoint")
            self._record_levels()
            self._changed.notify_all()  # takes waiting for room see the emptied window

    @contextlib.contextmanager
    def _restore_slot(self) -> Any:
        """Hold the feed's one restore slot; refuse a second restore instead of queueing it."""
        if self._restoring:
            raise RuntimeError(
                "load_state_dict/load_checkpoint refused: another restore of this feed is in flight; "
                "expected one restore at a time: wait for the first one to return (it raises if it "
                "failed), then restore again if needed"
            )
        self._restoring = True
        try:
            yield
        finally:
            self._restoring = False

    async def save_checkpoint(self, directory: str) -> str:
        """Write :meth:`state_dict` atomically to ``directory`` (on this actor's node); return the file."""
        state = await self.state_dict()
        path = checkpoint_path(directory)
        return str(await asyncio.get_running_loop().run_in_executor(None, save_checkpoint_file, path, state))

    async def load_checkpoint(self, directory: str) -> dict[str, Any]:
        """Load a checkpoint written by :meth:`save_checkpoint` (into a fresh or a live feed, as
        :meth:`load_state_dict`); return the restored ledger summary."""
        with self._restore_slot():
            path = checkpoint_path(directory)
            state = await asyncio.get_running_loop().run_in_executor(None, load_checkpoint_file, path)
            await self._restore(state)
            return dict(self._summary)

    async def shutdown(self) -> None:
        """Kill the rank actors and remove the placement group if this feed made it."""
        if self._gauges is not None:
            self._gauges.cancel()
        for actor in self._ranks:
            ray.kill(actor, no_restart=True)
        self._placement.release()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _ensure_ready(self) -> None:
        """Once: wait for the bundles and every rank's initial loader state; build the ledger."""
        if self._ledger is not None:
            return
        async with self._ready_lock:
            if self._ledger is not None:
                return
            timeout = self._config.control_timeout_s
            layout = self._placement.layout
            try:
                await asyncio.wait_for(asyncio.wrap_future(self._placement.placement_group.ready().future()), timeout)
            except asyncio.TimeoutError:
                raise RankTimeoutError(
                    f"the prompt feed could not reserve its placement group (bundles {layout['bundles']}, "
                    f"{layout['strategy']}) within {timeout:g} s; check that the cluster has these resources free"
                ) from None
            calls = [asyncio.wrap_future(actor.state_dict.remote().future()) for actor in self._ranks]
            try:
                states = await asyncio.wait_for(asyncio.gather(*calls), timeout)
            except asyncio.TimeoutError:
                raise RankTimeoutError(
                    f"the rank actors did not build their loaders within {timeout:g} s; raise "
                    "RuntimeConfig.control_timeout_s if they are only slow"
                ) from None
            self._initial_states = list(states)
            self._producers = [self._producer(rank, state) for rank, state in enumerate(states)]
            self._ledger = PromptLedger(self._producers, max_outstanding=self._feed_config.max_outstanding)
            self._summary = self._ledger.summary()
            self._gauges = asyncio.get_running_loop().create_task(self._update_gauges())

    async def _resolve(self, action: str, call: Any, uids: list[Any], total: str) -> None:
        """Run the ledger's ``action`` (all or nothing), forget the uids' hand-out times, wake waiting takes."""
        await self._ensure_ready()
        async with self._changed:
            self._refuse_if_restore_failed(action)
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

    def _oldest_age(self) -> float:
        if not self._handed_at:
            return 0.0
        return round(time.monotonic() - next(iter(self._handed_at.values())), 3)

    def _record_levels(self) -> None:
        """Set the gauges; call with the lock held (or when nothing runs on the worker thread)."""
        ledger = self._ledger
        self._metrics.record_levels(
            outstanding=ledger.outstanding, oldest_age_s=self._oldest_age(),
            low_water_mark=tuple(ledger.low_water_mark), epoch=ledger.epoch,
        )  # fmt: skip

    async def _update_gauges(self) -> None:
        while True:
            await asyncio.sleep(GAUGE_PERIOD_S)
            if not self._changed.locked():
                self._record_levels()

    def _refuse_if_restore_failed(self, call: str) -> None:
        refuse_if_restore_failed(self._restore_failure, call)

    def _check_checkpoint(self, state: Any) -> None:
        """Refuse a checkpoint of another format, layout or loader identity (nothing is changed)."""
        from rl_data.energon.identity import restore_differences
        from rl_data.fingerprint import differences

        check_content_format(state, fmt=CHECKPOINT_FORMAT, version=CHECKPOINT_FORMAT_VERSION, what="prompt feed")
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
        lines = differences(placement["layout"], self._placement.layout)
        if lines:
            raise ValueError("Placement layout changed: " + "; ".join(lines) + "; " + layout_fix(placement["layout"]))
        if len(producers) != len(self._producers):
            raise ValueError(
                f"prompt feed checkpoint holds {len(producers)} rank states for logical world size "
                f"{len(self._producers)}; the checkpoint is damaged"
            )
        for rank, (saved, current) in enumerate(zip(producers, self._initial_states)):
            lines = restore_differences(saved["loader"].get("identity"), current.get("identity"))
            if lines:
                raise ValueError(f"rank {rank}: Energon loader identity changed: " + "; ".join(lines))
            check_producer_state(rank, saved)
        self._ledger.check_state_dict(ledger)

    def _respawn_ranks(self) -> None:
        """Replace every rank actor by a fresh one in its bundle, with fresh producers (a rewind:
        not a rank death). New names: ``ray.kill`` frees the old ones asynchronously."""
        for actor in self._ranks:
            ray.kill(actor, no_restart=True)
        self._rewinds += 1
        self._ranks = [self._spawn(rank) for rank in range(self._config.world_size)]
        self._producers = [self._producer(rank, state) for rank, state in enumerate(self._initial_states)]
        self._fresh_ranks = True

    def _replace(self, rank: int, cause: BaseException) -> Any:
        """Kill rank's actor, start a fresh one in its bundle (the producer restores it); on the worker thread."""
        count_rank_death(self._restarts, rank, self._config.max_rank_restarts, cause)
        ray.kill(self._ranks[rank], no_restart=True)
        self._ranks[rank] = self._spawn(rank)
        self._metrics.record_restore("rank_recovery")
        return self._ranks[rank]

    def _producer(self, rank: int, initial_state: dict[str, Any]) -> RankProducer:
        return RankProducer(
            rank, self._ranks[rank], initial_state, replace=self._replace,
            batch_timeout_s=self._config.step_timeout_s, control_timeout_s=self._config.control_timeout_s,
        )  # fmt: skip

    def _spawn(self, rank: int) -> Any:
        return spawn_rank_actor(self._config, self._spec, self._placement, rank, self._rank_actor_name(rank))

    def _rank_actor_name(self, rank: int) -> str:
        """``<feed name>.<instance>[-w<rewinds>].rank<r>.<deaths so far>`` (listed in :meth:`status`)."""
        instance = f"{self._instance}-w{self._rewinds}" if self._rewinds else self._instance
        return f"{self._config.name}.{instance}.rank{rank}.{self._restarts[rank]}"


def start_prompt_feed(
    config: RuntimeConfig,
    loader_spec: LoaderSpec,
    feed_config: FeedConfig,
    *,
    placement_group: Any = None,
    bundle_of_rank: Optional[Sequence[int]] = None,
) -> Any:
    """Create the named feed actor (``config.name`` in ``config.namespace``), wait until every rank is ready."""
    check_prompt_spec(loader_spec)
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
