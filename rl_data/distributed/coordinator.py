"""``DataCoordinator``: hands out each training step's batches and checkpoints exactly once.

A named async actor (``config.name`` in ``config.namespace``) that creates one
:class:`RankActor` per logical rank in its placement-group bundle.

Ownership, decided deliberately: the coordinator *calls* ``RankActor.next_batch``, so it owns
every batch handed out (and the small state that follows it) until the step is committed.
Those objects live in the object store of the producer's node, not in the producer process,
so they survive a rank actor's death (not its node's); the coordinator never fetches a batch
(only the state, a few KB). Batches below Ray's inline threshold (100 KB) travel inside the
task reply and sit in the coordinator's memory until commit; larger ones stay in the object
store. The trainer borrows the refs returned by :meth:`next_step` as long as it needs them.

Exactly once, step by step:

* ``commit(k)`` stores, per rank, the loader state that followed step k's batch;
  ``state_dict()`` is that checkpoint. A step is *pending* from the moment it is handed out
  until it is committed, and its refs are kept while it is pending. The ranks hand out
  deferred states (``RankActor``: packed, without the packing buffers' encoded samples);
  ``state_dict()`` asks each rank to complete its committed one, and keeps it as it is (as
  exact, a restore re-encodes those samples) from a rank that cannot.
* ``next_step(expected_step=k)`` returns exactly step k: re-delivered (same batches) if it is
  pending, produced if it is the next one; a committed step or one past the next is refused.
  A consumer that passes the step it expects (``CoordinatorClient`` does) never skips a step:
  a call that timed out on its side and is repeated gets the same step. Without
  ``expected_step`` the next new step is produced (one consumer that never retries).
* A rank actor that dies is replaced in its bundle, restored from the last commit, and
  re-produces every pending step (identical batches, fresh refs) before it serves anything
  else. A replacement that times out is resumed by the next call, never skipped; a
  replacement that dies is redone from the start. A re-delivery first checks that every rank
  is alive, so after a node loss the lost batches are re-produced and re-delivered.
* ``load_state_dict`` is all or nothing: a rank that dies while restoring is replaced and
  restored again; if the restore still fails, every step, commit and checkpoint is refused,
  naming the rank, until a restore succeeds. A checkpoint that is refused (another format,
  layout or identity) changes nothing.
* **Rewind.** ``load_state_dict`` also works on a live coordinator (steps handed out, ranks
  prefetching): every pending and prefetched step is dropped, every rank actor restores in place
  (``RankActor.load_state_dict`` builds a new loader: an Energon loader restores only before it
  starts), and the next step is the one after the checkpoint's. This is what a framework restart
  needs (Ray Train rolls the model back to its last registered checkpoint while the data has
  moved on). A rewind costs a loader build per rank, not a new actor; it is not a rank death. A restore
  is refused only while another one is in flight. Refs handed out before a rewind stay readable
  while their holders keep them; committing or re-delivering their steps is refused.
* ``origin_state_dict()`` is the checkpoint the coordinator started from: its initial position,
  or the checkpoint loaded into it before its first step (a rewind does not change it). A
  framework restart with no checkpoint of its own rewinds there.
* The rank actors, their placement group, names, deaths, replacements and checkpoint checks
  are a :class:`~rl_data.distributed.rank_pool.RankPool`'s (shared with the prompt feed): the
  group is named after the coordinator, and a new coordinator of the same name removes a group
  left behind by a coordinator that died without ``shutdown``.

Elastic resume: the coordinator runs G logical shards (``RuntimeConfig.world_size``, one
rank actor each) and hands out one ref per DP rank (``parallel_layout.dp`` = D, dividing G):
DP rank d gets the batches of shards d, d+D, d+2D, ... merged in that order
(:mod:`rl_data.distributed.shard_map`, :mod:`rl_data.distributed.shard_merge`: lists
concatenated, padded columns re-padded as the task pads them). With D = G the shard refs are
handed out as they are; otherwise one small Ray task per DP rank merges them, so batches still
go through the object store and never through the coordinator. The checkpoint holds one state
per shard and the consumer layout it was saved with; it restores at any D dividing the same G,
and the global batch of every step is the same set of samples at every D.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import ray
from ray.exceptions import RayActorError

from rl_data.config_blocks import ConfigError
from rl_data.distributed.checkpoint_files import (
    checkpoint_path,
    load_checkpoint_file,
    pickled_size,
    save_checkpoint_file,
)
from rl_data.distributed.config import DEFAULT_NAME, LoaderSpec, RuntimeConfig, start_problems
from rl_data.distributed.metrics import CoordinatorMetrics
from rl_data.distributed.placement import consumer_layout, upgrade_layout_v1
from rl_data.distributed.rank_actor import without_completion_key
from rl_data.distributed.rank_pool import (
    RankFailedError,
    RankPool,
    RankTimeoutError,
    RestoreIncompleteError,
    count_rank_death,
    layout_fix,
    refuse_if_restore_failed,
)
from rl_data.distributed.shard_map import shard_assignment
from rl_data.distributed.step_book import DelayedRelease, StepBook
from rl_data.stateful import envelope, open_envelope

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_FORMAT_VERSION",
    "DataCoordinator",
    "RankFailedError",
    "RankTimeoutError",
    "RestoreIncompleteError",
    "count_rank_death",
    "layout_fix",
    "refuse_if_restore_failed",
    "start_data_coordinator",
]

CHECKPOINT_FORMAT = "rl_data.distributed.coordinator"
CHECKPOINT_FORMAT_VERSION = 1
#: Once a step timed out waiting for all ranks: each rank's last wait (the late ones are named).
_LATE_RANK_GRACE_S = 1.0


@dataclass
class _Recovery:
    """A replacement rank actor on its way back: restore call, then one re-production per pending step."""

    restore: Any  # the outstanding load_state_dict call, None once it finished
    step: int  # the next pending step to re-produce
    call: Any = None  # the outstanding next_batch call for ``step``


class DataCoordinator:
    """Feeds training steps from a :class:`RankPool` (one rank actor per logical rank) and keeps
    them in a :class:`StepBook` (run as a named Ray actor)."""

    STATE_FORMAT, STATE_VERSION = CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_VERSION  # (rl_data.stateful)

    def __init__(
        self,
        config: RuntimeConfig,
        loader_spec: LoaderSpec,
        placement_group: Any = None,
        bundle_of_rank: Optional[Sequence[int]] = None,
    ) -> None:
        self._config = config
        self._metrics = CoordinatorMetrics(config.name)
        self._pool = RankPool(
            config, loader_spec, owner="coordinator", placement_group=placement_group,
            bundle_of_rank=bundle_of_rank, deferred_states=True,
        )  # fmt: skip
        # Rank states and checkpoint files need torch (~1 CPU-s to import): import it while the
        # ranks start instead of when their first state arrives.
        threading.Thread(target=importlib.import_module, args=("torch",), name="import-torch", daemon=True).start()
        self._lock = asyncio.Lock()
        self._book = StepBook(config.release_delay_steps)
        self._next_calls: dict[int, Any] = {}  # rank -> outstanding next_batch call
        self._recoveries: dict[int, _Recovery] = {}  # rank -> its replacement, until caught up
        self._producing = False  # next_step produced (or tried to) since creation or the last restore
        self._rewinds = 0
        self._saved_deferred = 0  # rank states checkpoints took as handed out (not completed)
        self._dp = _DPHandOut(config.parallel_layout.dp, config.release_delay_steps)

    async def ready(self) -> dict[str, Any]:
        """Wait for the placement group and every rank's loader; return :meth:`status`."""
        await self._ensure_ready()
        return await self.status()

    async def _ensure_ready(self) -> None:
        """Once: wait for the ranks; their initial states are the step-0 checkpoint (and the origin)."""
        if self._book.committed_states:
            return
        states = await self._pool.ready()
        if self._dp.size < self._pool.world_size and self._dp.merge_spec is None:
            self._dp.merge_spec = await self._pool.wait(self._pool.actors[0].merge_spec.remote(), 0, "describing its batches")
        if not self._book.committed_states:  # a concurrent call may have finished first
            self._book.reset(0, states, origin=True)

    async def next_step(self, commit: Optional[int] = None, expected_step: Optional[int] = None) -> tuple[int, list[Any]]:
        """Step k and one batch ref per DP rank (refs are handed out, data is never fetched).

        ``commit``: first :meth:`commit` that step, so a trainer needs one round trip per
        step: ``next_step(commit=k)`` once step k is trained. ``expected_step``: the step the
        caller wants; a pending step is re-delivered, the next one is produced (see the module
        docstring). Without it the next new step is produced.
        """
        if commit is not None:
            await self.commit(commit)
        started = time.monotonic()
        await self._ensure_ready()
        async with self._lock:
            self._pool.refuse_if_restore_failed("next_step")
            step = self._book.step_to_hand_out(expected_step)
            if step <= self._book.handed_step:
                return step, await self._redeliver(step)
            self._producing = True
            results = await self._produce(step)
            self._next_calls.clear()
            self._book.hand_out([ref for ref, _ in results], [state for _, state in results])
            refs = self._dp.refs(step, self._book.pending[step][0])
            self._metrics.record_step(time.monotonic() - started)
            return step, refs

    async def redeliver(self, step: int) -> list[Any]:
        """Fresh refs of pending ``step`` (handed out, not committed), e.g. after a fetch failed.

        Every rank is checked first: a rank that died (with its node's objects) is replaced and
        re-produces the pending steps, so the refs returned can be fetched.
        """
        await self._ensure_ready()
        async with self._lock:
            self._pool.refuse_if_restore_failed("redeliver")
            self._book.check_pending(step)
            return await self._redeliver(step)

    async def progress(self) -> dict[str, int]:
        """``{"committed_step", "handed_step", "origin_step", "rewinds"}`` (answers at once, also
        while a step is produced or a restore runs)."""
        book = self._book
        return {
            "committed_step": book.committed_step,
            "handed_step": book.handed_step,
            "origin_step": book.origin[0] if book.origin else 0,
            "rewinds": self._rewinds,
        }

    async def commit(self, step: int) -> None:
        """Record that the trainer consumed every step up to and including ``step``."""
        async with self._lock:
            self._pool.refuse_if_restore_failed("commit")
            done = self._book.commit(step)
            self._dp.forget(done)
            if done:
                self._metrics.record_committed(step)

    async def state_dict(self, step: Optional[int] = None) -> dict[str, Any]:
        """The checkpoint for the last committed step (loads with ``torch.load(weights_only=True)``).

        ``step``: the checkpoint after a pending step instead (handed out, not yet committed), for a
        consumer that saves a step's checkpoint before every consumer of it is known to be done
        (``rl_data.integrations.ray_train``): restoring it continues at ``step + 1``.
        """
        await self._ensure_ready()
        self._pool.refuse_if_restore_failed("state_dict")
        started = time.monotonic()
        state = self._checkpoint(*await self._completed_states(*self._book.states_at(step)))
        self._metrics.record_checkpoint(time.monotonic() - started, pickled_size(state))
        return state

    async def origin_state_dict(self) -> dict[str, Any]:
        """The checkpoint this coordinator started from: the initial position, or the checkpoint
        loaded into it before its first step (rewinds keep it). Load it to start over."""
        await self._ensure_ready()
        return self._checkpoint(*self._book.origin)

    def _checkpoint(self, step: int, states: list[dict[str, Any]]) -> dict[str, Any]:
        placement = self._pool.placement
        return envelope(self.STATE_FORMAT, self.STATE_VERSION, {
            "step": step,
            "placement": {"fingerprint": placement.fingerprint, "layout": placement.layout},
            "consumer_layout": consumer_layout(self._config),
            "ranks": [without_completion_key(state) for state in states],
        })

    async def _completed_states(self, step: int, states: list[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
        """``step`` and its ``states``, each completed by its rank once (:meth:`RankPool.complete_states`),
        kept so in the book for later checkpoints and for the step's commit."""
        completed, kept_deferred = await self._pool.complete_states(states, f"step {step}")
        self._saved_deferred += kept_deferred
        for rank, (handed, done) in enumerate(zip(states, completed)):
            self._book.replace_state(step, rank, handed, done)
        return step, completed

    async def load_state_dict(self, state: dict[str, Any], reweight: bool = False) -> None:
        """Restore every rank from a checkpoint, all or nothing; on a live coordinator, a rewind.

        ``reweight``: a mixture source whose member weights changed (nothing else) continues
        with the new weights from every member's restored position (see
        ``EnergonSFTDataLoader.load_state_dict``); the rank states record the change.

        Refuses (``ValueError``, nothing changed) another format, another placement layout
        (number of logical shards, bundles, strategy) and any rank whose loader identity
        differs, listing the differences; the DP size may differ (it divides the shards).
        Refuses (``RuntimeError``) a call while another restore is in flight. Once steps were
        handed out, the restore is a rewind (see the module doc: pending and prefetched steps
        are dropped, the rank actors restore in place). A rank that dies while restoring is replaced
        and restored again; if the restore still fails, steps are refused until one succeeds.
        """
        with self._pool.restore_slot("load_state_dict"):
            await self._ensure_ready()
            async with self._lock:
                await self._restore(upgrade_layout_v1(state), reweight)  # v1: consumer layout inside the data layout

    async def _restore(self, state: dict[str, Any], reweight: bool) -> None:
        _check_checkpoint(state, self._pool, reweight)
        rewind = self._producing or bool(self._next_calls) or bool(self._recoveries)
        with self._pool.restoring(f"the checkpoint of step {state['step']}"):
            if rewind:
                self._renew_ranks()
            await asyncio.gather(*(self._pool.restore_rank(rank, saved, reweight) for rank, saved in enumerate(state["ranks"])))
        # the states the ranks hold now (a re-weighted mixture records its new weights)
        states = await asyncio.gather(
            *(self._pool.wait(a.state_dict.remote(), r, "describing its restored state") for r, a in enumerate(self._pool.actors))
        ) if reweight else [without_completion_key(saved) for saved in state["ranks"]]  # fmt: skip
        self._book.reset(int(state["step"]), states, origin=not rewind)
        self._dp.forget()
        self._producing = False
        self._rewinds += rewind
        self._metrics.record_restore("rewind" if rewind else "checkpoint")
        self._metrics.record_committed(self._book.committed_step)

    async def save_checkpoint(self, directory: str) -> str:
        """Write :meth:`state_dict` atomically to ``directory`` (on this actor's node)."""
        return str(save_checkpoint_file(checkpoint_path(directory), await self.state_dict()))

    async def load_checkpoint(self, directory: str, reweight: bool = False) -> int:
        """Load a checkpoint written by :meth:`save_checkpoint`; return its step (``reweight``: see
        :meth:`load_state_dict`)."""
        state = load_checkpoint_file(checkpoint_path(directory))
        await self.load_state_dict(state, reweight)
        return self._book.committed_step

    async def status(self) -> dict[str, Any]:
        """Steps, restarts and what every rank is doing (ranks that do not answer are marked)."""
        return {
            # placement_fingerprint, restarts, restore_failure, rank_actor_names, ranks, objects_in_memory
            **await self._pool.status(),
            "pid": os.getpid(),
            "handed_step": self._book.handed_step,
            "committed_step": self._book.committed_step,
            "logical_shards": self._pool.world_size,
            "dp": self._dp.size,
            "recovering_ranks": sorted(self._recoveries),
            "rewinds": self._rewinds,
            # rank states checkpoints hold without the packing buffers' samples (a rank could
            # not complete them): exact, their restore encodes those samples again
            "states_saved_deferred": self._saved_deferred,
            # refs of committed (or rewound) steps held for release_delay_steps
            "refs_release_delayed": len(self._book.released),
        }

    async def shutdown(self) -> None:
        """Kill the rank actors and remove the placement group if this coordinator made it."""
        self._pool.shutdown()

    async def _redeliver(self, step: int) -> list[Any]:
        """Pending step's refs, after every rank answered and every replacement caught up."""
        await asyncio.gather(*(self._caught_up(r, check_alive=True) for r in range(self._pool.world_size)))
        return self._dp.refs(step, self._book.pending[step][0])

    async def _produce(self, step: int) -> list[tuple[Any, dict[str, Any]]]:
        """Every rank's batch ref and following state for new ``step``.

        Fast path, when no replacement is catching up: one call per rank and one batched wait for
        all their states (:meth:`RankPool.wait_all`). If any rank died, failed or is late, each
        rank's own wait sorts it out, on the same calls.
        """
        ranks, late = range(self._pool.world_size), False
        if not self._recoveries:
            calls = [self._next_call(rank) for rank in ranks]
            try:  # None: a rank died or failed, handled rank by rank below on the same calls
                states = await self._pool.wait_all([state for _, state in calls], self._config.step_timeout_s)
                if states is not None:
                    return [(batch, state) for (batch, _), state in zip(calls, states)]
            except TimeoutError:
                late = True  # the step's time is up: each rank's wait names the late ones
        results = await asyncio.gather(*(self._next_batch(rank, step, late) for rank in ranks), return_exceptions=True)
        failures = [result for result in results if isinstance(result, BaseException)]
        if failures:  # every rank finished or timed out: nothing runs on in the background
            raise failures[0]
        return results

    async def _next_batch(self, rank: int, step: int, late: bool = False) -> tuple[Any, dict[str, Any]]:
        """Rank's batch ref and following state for ``step``, replacing the rank if it died;
        ``late``: the step's timeout already ran out (a short last wait)."""
        limit = self._config.step_timeout_s
        timeout = _LATE_RANK_GRACE_S if late else limit
        while True:
            await self._caught_up(rank)
            try:
                batch_ref, state_ref = self._next_call(rank)
                doing = f"producing the batch for step {step}"
                return batch_ref, await self._pool.wait(state_ref, rank, doing, timeout, limit_s=limit)
            except RayActorError as error:
                self._replace(rank, error)
                timeout = limit  # the replacement gets the step's whole time

    def _next_call(self, rank: int) -> tuple[Any, Any]:
        """Rank's outstanding ``next_batch`` call, made if there is none (kept across a timeout so a retry does not skip)."""
        if rank not in self._next_calls:
            self._next_calls[rank] = self._pool.actors[rank].next_batch.remote()
        return self._next_calls[rank]

    async def _caught_up(self, rank: int, *, check_alive: bool = False) -> None:
        """Return once rank's actor is restored and has re-produced every pending step."""
        while True:
            try:
                if check_alive and rank not in self._recoveries:
                    await self._pool.wait(self._pool.actors[rank].status.remote(), rank, "answering a liveness check")
                await self._finish_recovery(rank)
                return
            except RayActorError as error:
                self._replace(rank, error)

    async def _finish_recovery(self, rank: int) -> None:
        recovery = self._recoveries.get(rank)
        if recovery is None:
            return
        actor = self._pool.actors[rank]
        if recovery.restore is not None:
            await self._pool.wait(recovery.restore, rank, "restoring the last committed state")
            recovery.restore = None
        while recovery.step <= self._book.handed_step:
            if recovery.call is None:  # kept across a timeout: the retry waits for the same batch
                recovery.call = actor.next_batch.remote()
            batch_ref, state_ref = recovery.call
            doing = f"re-producing the batch for step {recovery.step}"
            state = await self._pool.wait(state_ref, rank, doing, self._config.step_timeout_s)
            self._book.reproduced(recovery.step, rank, batch_ref, state)
            recovery.step, recovery.call = recovery.step + 1, None
        del self._recoveries[rank]
        self._metrics.record_restore("rank_recovery")

    def _replace(self, rank: int, cause: BaseException) -> None:
        """Count the death, start a new actor in the same bundle restoring the last commit; it
        catches up before serving."""
        self._next_calls.pop(rank, None)
        self._recoveries.pop(rank, None)
        actor = self._pool.replace(rank, cause, "serving steps")
        restore = actor.load_state_dict.remote(self._book.committed_states[rank])
        self._recoveries[rank] = _Recovery(restore=restore, step=self._book.committed_step + 1)

    def _renew_ranks(self) -> None:
        """A rewind: every outstanding call and recovery is dropped (the ranks restore in place)."""
        self._next_calls.clear()
        self._recoveries.clear()


class _DPHandOut:
    """One ref per DP rank of a step's shard refs: the shard refs themselves (D = G), or one merge
    task per DP rank over its shards, made once per set of shard refs (a rank that re-produced its
    batch gets its DP rank a new merge)."""

    def __init__(self, size: int, release_delay: int) -> None:
        self.size = size
        self.merge_spec: Optional[dict[str, Any]] = None  # from rank 0, when DP ranks merge shards
        self._made: dict[int, tuple[tuple[Any, ...], list[Any]]] = {}  # step -> (shard refs, DP refs)
        self._released = DelayedRelease(release_delay)  # as the StepBook's refs

    def refs(self, step: int, shard_refs: Sequence[Any]) -> list[Any]:
        shard_refs = tuple(shard_refs)
        if self.size == len(shard_refs):
            return list(shard_refs)
        made = self._made.get(step)
        if made is None or made[0] != shard_refs:
            refs = [
                _merge_shards.remote(self.merge_spec, *(shard_refs[s] for s in shards))
                for shards in shard_assignment(len(shard_refs), self.size)
            ]
            made = self._made[step] = (shard_refs, refs)
        return list(made[1])

    def forget(self, steps: Optional[Sequence[int]] = None) -> None:
        """Drop the merges of ``steps`` (committed), or of every step (a restore), releasing their
        refs after the next ones (see :class:`~rl_data.distributed.step_book.DelayedRelease`)."""
        for step in sorted(self._made) if steps is None else steps:
            made = self._made.pop(step, None)
            if made is not None:
                self._released.hold(made[1])


@ray.remote(num_cpus=0)
def _merge_shards(spec: dict[str, Any], *batches: Any) -> Any:
    """One DP rank's batch: the shard batches merged in order (a task, so data skips the coordinator)."""
    from rl_data.distributed.shard_merge import MergeSpec, merge_shard_batches

    return merge_shard_batches(MergeSpec.from_json(spec), batches)


def _check_checkpoint(state: Any, pool: RankPool, reweight: bool) -> None:
    """Refuse a coordinator checkpoint of another format; one whose parts are missing or of the
    wrong type (a clear ``ValueError``, never a ``KeyError`` from deep inside the restore); one of
    another layout or loader identity. Nothing is changed; with ``reweight``, changed mixture
    weights alone are accepted."""
    open_envelope(state, fmt=CHECKPOINT_FORMAT, version=CHECKPOINT_FORMAT_VERSION, what="data coordinator")
    placement, ranks, step = state.get("placement"), state.get("ranks"), state.get("step")
    problems = []
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        problems.append(f"'step' is {step!r}, expected an integer >= 0")
    if not isinstance(placement, dict) or not isinstance(placement.get("layout"), dict):
        problems.append(f"'placement' is {type(placement).__name__} without a 'layout' mapping, expected {{'fingerprint', 'layout'}}")
    if not isinstance(ranks, list) or not all(isinstance(r, dict) for r in ranks):
        problems.append("'ranks' is not a list of per-rank loader states")
    if problems:
        raise ValueError(
            "coordinator checkpoint is malformed: " + "; ".join(problems) + "; it was not written by "
            "save_checkpoint of this version, restore from another checkpoint"
        )
    pool.check_checkpoint(placement["layout"], [saved.get("identity") for saved in ranks], reweight=reweight)


def start_data_coordinator(
    config: RuntimeConfig,
    loader_spec: LoaderSpec,
    *,
    placement_group: Any = None,
    bundle_of_rank: Optional[Sequence[int]] = None,
    check_datasets: bool = True,
) -> Any:
    """Create the named coordinator actor, wait until every rank is ready; return its handle.

    First, on the driver, before any actor or placement group starts: every problem of the
    arguments, the datasets' metadata and the processor factory (:func:`start_problems`) is raised
    as one :class:`~rl_data.config_blocks.ConfigError`.

    ``check_datasets=False`` skips the dataset checks, for a driver that cannot read the datasets
    (e.g. a head node without the shared mount the rank actors read): a rank then refuses a bad
    path when it builds its loader.
    """
    problems = start_problems(
        config, loader_spec, placement_group=placement_group, bundle_of_rank=bundle_of_rank, check_datasets=check_datasets
    )
    if problems:
        raise ConfigError(f"data coordinator {getattr(config, 'name', DEFAULT_NAME)!r} was not started", problems)
    handle = (
        ray.remote(DataCoordinator)
        .options(name=config.name, namespace=config.namespace, num_cpus=0, max_restarts=0, lifetime=config.lifetime)
        .remote(config, loader_spec, placement_group, bundle_of_rank)
    )
    try:
        ray.get(handle.ready.remote(), timeout=config.control_timeout_s + 30)
    except BaseException:
        ray.kill(handle, no_restart=True)
        raise
    return handle
