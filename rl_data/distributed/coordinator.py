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
  prefetching): every pending and prefetched step is dropped, every rank actor is replaced by a
  fresh one in its bundle (an Energon loader restores only before it starts) and restored, and
  the next step is the one after the checkpoint's. This is what a framework restart needs (Ray
  Train rolls the model back to its last registered checkpoint while the data has moved on). A
  rewind costs a rank actor's start-up per rank; it does not count as a rank death. A restore
  is refused only while another one is in flight. Refs handed out before a rewind stay readable
  while their holders keep them; committing or re-delivering their steps is refused.
* ``origin_state_dict()`` is the checkpoint the coordinator started from: its initial position,
  or the checkpoint loaded into it before its first step (a rewind does not change it). A
  framework restart with no checkpoint of its own rewinds there.
* The placement group is named after the coordinator; a new coordinator of the same name
  removes a group left behind by a coordinator that died without ``shutdown``.

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
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import ray
from ray.exceptions import RayActorError, RayTaskError

from rl_data.distributed.checkpoint_files import (
    check_content_format,
    checkpoint_path,
    load_checkpoint_file,
    save_checkpoint_file,
)
from rl_data.distributed.config import LoaderSpec, RuntimeConfig
from rl_data.distributed.metrics import CoordinatorMetrics
from rl_data.distributed.shard_map import shard_assignment
from rl_data.distributed.placement import (
    RankPlacement,
    adopt_placement_group,
    consumer_layout,
    create_rank_placement,
    remove_leftover_placement_group,
    upgrade_layout_v1,
)
from rl_data.distributed.rank_actor import COMPLETION_KEY, RankActor, without_completion_key

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "rl_data.distributed.coordinator"
CHECKPOINT_FORMAT_VERSION = 1


class RankTimeoutError(TimeoutError):
    """A rank actor delivered nothing within its timeout."""


class RankFailedError(RuntimeError):
    """A rank actor failed (its loader raised, or it died more often than allowed)."""


class RestoreIncompleteError(RuntimeError):
    """The last checkpoint restore failed part way: steps (or prompt takes) are refused until a restore succeeds."""


def count_rank_death(restarts: list[int], rank: int, max_restarts: int, cause: BaseException, during: str = "") -> None:
    """Count one more death of ``rank``; past ``max_restarts`` raise :class:`RankFailedError`."""
    restarts[rank] += 1
    if restarts[rank] > max_restarts:
        raise RankFailedError(
            f"rank {rank} died {restarts[rank]} times, more than max_rank_restarts={max_restarts}; "
            f"last cause{during}: {str(cause).splitlines()[0]}"
        ) from None


def refuse_if_restore_failed(failure: Optional[str], call: str) -> None:
    """Raise :class:`RestoreIncompleteError` for ``call`` while the last restore's ``failure`` stands."""
    if failure is not None:
        raise RestoreIncompleteError(
            f"refusing {call}: {failure}; some ranks may hold the checkpoint's state "
            "and others not; call load_checkpoint/load_state_dict again until it succeeds"
        )


@dataclass
class _Recovery:
    """A replacement rank actor on its way back: restore call, then one re-production per pending step."""

    restore: Any  # the outstanding load_state_dict call, None once it finished
    step: int  # the next pending step to re-produce
    call: Any = None  # the outstanding next_batch call for ``step``


class DataCoordinator:
    """Feeds training steps from one rank actor per logical rank (run as a named Ray actor)."""

    def __init__(
        self,
        config: RuntimeConfig,
        loader_spec: LoaderSpec,
        placement_group: Any = None,
        bundle_of_rank: Optional[Sequence[int]] = None,
    ) -> None:
        self._config, self._spec = config, loader_spec
        self._metrics = CoordinatorMetrics(config.name)
        if placement_group is None:
            if self._holds_its_name():  # so no live coordinator of this name uses a group of that name
                remove_leftover_placement_group(config)
            self._placement: RankPlacement = create_rank_placement(config)
        else:
            self._placement = adopt_placement_group(placement_group, bundle_of_rank or (), config)
        self._restarts = [0] * config.world_size
        self._instance = os.urandom(3).hex()  # rank actor names never collide with a previous run's
        self._ranks = [self._spawn(r) for r in range(config.world_size)]
        # Rank states and checkpoint files need torch (~1 CPU-s to import): import it while the
        # ranks start instead of when their first state arrives.
        threading.Thread(target=importlib.import_module, args=("torch",), name="import-torch", daemon=True).start()
        self._lock = asyncio.Lock()
        self._committed_step = 0
        self._committed_states: list[dict[str, Any]] = []
        self._handed_step = 0
        self._pending: dict[int, tuple[list[Any], list[dict[str, Any]]]] = {}
        self._next_calls: dict[int, Any] = {}  # rank -> outstanding next_batch call
        self._recoveries: dict[int, _Recovery] = {}  # rank -> its replacement, until caught up
        self._producing = False  # next_step produced (or tried to) since creation or the last restore
        self._restore_failure: Optional[str] = None
        self._restoring = False  # a load_state_dict is in flight
        self._origin: Optional[tuple[int, list[dict[str, Any]]]] = None  # see origin_state_dict
        self._rewinds = 0
        self._saved_deferred = 0  # rank states checkpoints took as handed out (not completed)
        self._dp = config.parallel_layout.dp
        self._merge_spec: Optional[dict[str, Any]] = None  # from rank 0, when DP ranks merge shards
        self._dp_refs: dict[int, tuple[tuple[Any, ...], list[Any]]] = {}  # step -> (shard refs, DP refs)

    async def ready(self) -> dict[str, Any]:
        """Wait for the placement group and every rank's loader; return :meth:`status`."""
        await self._ensure_ready()
        return await self.status()

    async def _ensure_ready(self) -> None:
        """Once: wait for the bundles and take every rank's initial state (the step-0 checkpoint)."""
        if self._committed_states:
            return
        timeout = self._config.control_timeout_s
        layout = self._placement.layout
        reserving = f"reserving the placement group (bundles {layout['bundles']}, {layout['strategy']})"
        await self._await(self._placement.placement_group.ready(), timeout, None, reserving)
        states = await asyncio.gather(
            *(self._await(a.state_dict.remote(), timeout, r, "building its loader") for r, a in enumerate(self._ranks))
        )
        if self._dp < len(self._ranks) and self._merge_spec is None:
            self._merge_spec = await self._await(self._ranks[0].merge_spec.remote(), timeout, 0, "describing its batches")
        if not self._committed_states:  # a concurrent call may have finished first
            self._committed_states = list(states)
            self._origin = (0, list(states))

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
            self._refuse_if_restore_failed("next_step")
            step = self._handed_step + 1 if expected_step is None else self._check_expected(expected_step)
            if step <= self._handed_step:
                return step, await self._redeliver(step)
            self._producing = True
            results = await asyncio.gather(
                *(self._next_batch(r, step) for r in range(len(self._ranks))), return_exceptions=True
            )
            failures = [r for r in results if isinstance(r, BaseException)]
            if failures:  # every rank finished or timed out: nothing runs on in the background
                raise failures[0]
            self._next_calls.clear()
            self._pending[step] = ([ref for ref, _ in results], [state for _, state in results])
            self._handed_step = step
            refs = self._hand_out(step)
            self._metrics.record_step(time.monotonic() - started)
            return step, refs

    async def redeliver(self, step: int) -> list[Any]:
        """Fresh refs of pending ``step`` (handed out, not committed), e.g. after a fetch failed.

        Every rank is checked first: a rank that died (with its node's objects) is replaced and
        re-produces the pending steps, so the refs returned can be fetched.
        """
        await self._ensure_ready()
        async with self._lock:
            self._refuse_if_restore_failed("redeliver")
            if not self._committed_step < step <= self._handed_step:
                raise ValueError(
                    f"cannot re-deliver step {step}: the pending steps (handed out, not committed) are "
                    f"{self._pending_range()}; ask next_step for a new step"
                )
            return await self._redeliver(step)

    async def progress(self) -> dict[str, int]:
        """``{"committed_step", "handed_step", "origin_step", "rewinds"}`` (answers at once, also
        while a step is produced or a restore runs)."""
        return {
            "committed_step": self._committed_step,
            "handed_step": self._handed_step,
            "origin_step": self._origin[0] if self._origin else 0,
            "rewinds": self._rewinds,
        }

    async def commit(self, step: int) -> None:
        """Record that the trainer consumed every step up to and including ``step``."""
        async with self._lock:
            self._refuse_if_restore_failed("commit")
            if step == self._committed_step:
                return
            if step < self._committed_step:
                raise ValueError(f"cannot commit step {step}: step {self._committed_step} is already committed")
            if step > self._handed_step:
                raise ValueError(
                    f"cannot commit step {step}: the last step handed out is {self._handed_step}; "
                    "commit only steps returned by next_step"
                )
            self._committed_states = list(self._pending[step][1])
            for done in range(self._committed_step + 1, step + 1):
                del self._pending[done]
                self._dp_refs.pop(done, None)
            self._committed_step = step
            self._metrics.record_committed(step)

    async def state_dict(self, step: Optional[int] = None) -> dict[str, Any]:
        """The checkpoint for the last committed step (loads with ``torch.load(weights_only=True)``).

        ``step``: the checkpoint after a pending step instead (handed out, not yet committed), for a
        consumer that saves a step's checkpoint before every consumer of it is known to be done
        (``rl_data.integrations.ray_train``): restoring it continues at ``step + 1``.
        """
        await self._ensure_ready()
        self._refuse_if_restore_failed("state_dict")
        if step is not None and step != self._committed_step and step not in self._pending:
            raise ValueError(
                f"no checkpoint of step {step}: the last committed step is {self._committed_step} and the "
                f"pending steps are {self._pending_range()}"
            )
        return self._checkpoint(*await self._completed_states(step))

    async def origin_state_dict(self) -> dict[str, Any]:
        """The checkpoint this coordinator started from: the initial position, or the checkpoint
        loaded into it before its first step (rewinds keep it). Load it to start over."""
        await self._ensure_ready()
        return self._checkpoint(*self._origin)

    def _checkpoint(self, step: int, states: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT,
            "format_version": CHECKPOINT_FORMAT_VERSION,
            "step": step,
            "placement": {"fingerprint": self._placement.fingerprint, "layout": self._placement.layout},
            "consumer_layout": consumer_layout(self._config),
            "ranks": [without_completion_key(state) for state in states],
        }

    async def _completed_states(self, step: Optional[int] = None) -> tuple[int, list[dict[str, Any]]]:
        """The committed (or a pending) step and its states, each completed by its rank once (a
        committed one kept for later checkpoints); a rank that cannot (replaced since, or not
        answering within the control timeout) leaves its state as it is: as exact, a restore from
        it encodes more."""
        if step is None or step == self._committed_step:
            step, states = self._committed_step, list(self._committed_states)
        else:
            states = list(self._pending[step][1])
        deferred = [rank for rank, state in enumerate(states) if COMPLETION_KEY in state]
        results = await asyncio.gather(
            *(
                self._await(
                    self._ranks[rank].complete_state.remote(states[rank]),
                    self._config.control_timeout_s, rank, "completing its state for a checkpoint",
                )
                for rank in deferred
            ),
            return_exceptions=True,
        )
        for rank, result in zip(deferred, results):
            if isinstance(result, BaseException):
                logger.warning(
                    "rank %d did not complete its state of step %d (%s); the checkpoint keeps it as handed out "
                    "(exact; its restore encodes the packing buffers' samples again)", rank, step, result,
                )
                result = without_completion_key(states[rank])
                self._saved_deferred += 1
            if self._committed_states[rank] is states[rank]:  # not committed past it meanwhile
                self._committed_states[rank] = result
            if step in self._pending and self._pending[step][1][rank] is states[rank]:
                self._pending[step][1][rank] = result  # completed once, also for its commit
            states[rank] = result
        return step, states

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
        are dropped, fresh rank actors restore). A rank that dies while restoring is replaced
        and restored again; if the restore still fails, steps are refused until one succeeds.
        """
        if self._restoring:
            raise RuntimeError(
                "load_state_dict refused: another restore of this coordinator is in flight; wait for it "
                "(one process, e.g. DP rank 0, restores; the others wait for it)"
            )
        self._restoring = True
        try:
            await self._ensure_ready()
            async with self._lock:
                await self._restore(upgrade_layout_v1(state), reweight)  # v1: consumer layout inside the data layout
        finally:
            self._restoring = False

    async def _restore(self, state: dict[str, Any], reweight: bool) -> None:
        self._check_checkpoint(state, reweight)
        rewind = self._producing or bool(self._next_calls) or bool(self._recoveries)
        self._restore_failure = f"restoring the checkpoint of step {state['step']} did not finish"
        try:
            if rewind:
                self._renew_ranks()
            await asyncio.gather(*(self._restore_rank(rank, saved, reweight) for rank, saved in enumerate(state["ranks"])))
        except BaseException as error:
            self._restore_failure = f"restoring the checkpoint of step {state['step']} failed: {error}"
            raise
        self._restore_failure = None
        # the states the ranks hold now (a re-weighted mixture records its new weights)
        self._committed_states = list(await asyncio.gather(
            *(self._await(a.state_dict.remote(), self._config.control_timeout_s, r, "describing its restored state")
              for r, a in enumerate(self._ranks))
        )) if reweight else [without_completion_key(saved) for saved in state["ranks"]]
        self._committed_step = self._handed_step = int(state["step"])
        self._pending.clear()
        self._dp_refs.clear()
        self._producing = False
        if rewind:
            self._rewinds += 1
        else:
            self._origin = (self._committed_step, list(self._committed_states))
        self._metrics.record_restore("rewind" if rewind else "checkpoint")
        self._metrics.record_committed(self._committed_step)

    async def save_checkpoint(self, directory: str) -> str:
        """Write :meth:`state_dict` atomically to ``directory`` (on this actor's node)."""
        return str(save_checkpoint_file(checkpoint_path(directory), await self.state_dict()))

    async def load_checkpoint(self, directory: str, reweight: bool = False) -> int:
        """Load a checkpoint written by :meth:`save_checkpoint`; return its step (``reweight``: see
        :meth:`load_state_dict`)."""
        state = load_checkpoint_file(checkpoint_path(directory))
        await self.load_state_dict(state, reweight)
        return self._committed_step

    async def status(self) -> dict[str, Any]:
        """Steps, restarts and what every rank is doing (ranks that do not answer are marked)."""
        ranks = []
        for rank, actor in enumerate(self._ranks):
            try:
                ranks.append(await asyncio.wait_for(asyncio.wrap_future(actor.status.remote().future()), 10))
            except (asyncio.TimeoutError, RayActorError) as error:
                ranks.append({"rank": rank, "activity": f"not answering ({type(error).__name__})"})
        return {
            "pid": os.getpid(),
            "handed_step": self._handed_step,
            "committed_step": self._committed_step,
            "placement_fingerprint": self._placement.fingerprint,
            "logical_shards": len(self._ranks),
            "dp": self._dp,
            "restarts": list(self._restarts),
            "recovering_ranks": sorted(self._recoveries),
            "restore_failure": self._restore_failure,
            "rewinds": self._rewinds,
            # rank states checkpoints hold without the packing buffers' samples (a rank could
            # not complete them): exact, their restore encodes those samples again
            "states_saved_deferred": self._saved_deferred,
            "rank_actor_names": [self._rank_actor_name(r) for r in range(len(self._ranks))],
            "ranks": ranks,
        }

    async def shutdown(self) -> None:
        """Kill the rank actors and remove the placement group if this coordinator made it."""
        for actor in self._ranks:
            ray.kill(actor, no_restart=True)
        self._placement.release()

    def _holds_its_name(self) -> bool:
        try:
            holder = ray.get_actor(self._config.name, namespace=self._config.namespace)
        except ValueError:
            return False
        return holder._actor_id.hex() == ray.get_runtime_context().get_actor_id()

    def _check_expected(self, expected: int) -> int:
        if expected <= self._committed_step or expected > self._handed_step + 1:
            committed = "" if expected > self._committed_step else f"step {expected} is already committed; "
            raise ValueError(
                f"cannot hand out step {expected}: {committed}the pending steps are {self._pending_range()} "
                f"and the next new step is {self._handed_step + 1}; ask for one of those"
            )
        return expected

    def _pending_range(self) -> str:
        first, last = self._committed_step + 1, self._handed_step
        return "none" if last < first else f"{first}..{last}"

    def _refuse_if_restore_failed(self, call: str) -> None:
        refuse_if_restore_failed(self._restore_failure, call)

    def _check_checkpoint(self, state: Any, reweight: bool = False) -> None:
        """Refuse a checkpoint of another format, layout or loader identity (nothing is changed);
        with ``reweight``, changed mixture weights alone are accepted."""
        from rl_data.energon.identity import restore_differences
        from rl_data.energon.mixture import weight_change_lines
        from rl_data.fingerprint import differences

        check_content_format(state, fmt=CHECKPOINT_FORMAT, version=CHECKPOINT_FORMAT_VERSION, what="data coordinator")
        _check_checkpoint_structure(state)
        lines = differences(state["placement"]["layout"], self._placement.layout)
        if lines:
            raise ValueError("Placement layout changed: " + "; ".join(lines) + "; " + layout_fix(state["placement"]["layout"]))
        if len(state["ranks"]) != len(self._ranks):
            raise ValueError(
                f"checkpoint holds {len(state['ranks'])} rank states for logical world size "
                f"{len(self._ranks)}; the checkpoint is damaged"
            )
        for rank, (saved, current) in enumerate(zip(state["ranks"], self._committed_states)):
            lines = restore_differences(saved.get("identity"), current.get("identity"))
            if reweight:
                lines = [line for line in lines if line not in weight_change_lines(lines)]
            if lines:
                raise ValueError(f"rank {rank}: Energon loader identity changed: " + "; ".join(lines))

    async def _restore_rank(self, rank: int, saved: dict[str, Any], reweight: bool = False) -> None:
        """Load ``saved`` into rank's actor, replacing the actor (no restore of its own) if it died."""
        while True:
            try:
                call = self._ranks[rank].load_state_dict.remote(saved, reweight)
                await self._await(call, self._config.control_timeout_s, rank, "restoring its checkpoint state")
                return
            except RayActorError as error:
                self._respawn(rank, error, "restoring a checkpoint")

    def _spawn(self, rank: int) -> Any:
        return (
            ray.remote(RankActor)
            .options(
                name=self._rank_actor_name(rank),
                namespace=self._config.namespace,
                num_cpus=self._config.rank_actor_num_cpus,
                scheduling_strategy=self._placement.scheduling_strategy(rank),
                max_restarts=0,
            )
            .remote(
                rank=rank,
                world_size=self._config.world_size,
                placement_fingerprint=self._placement.fingerprint,
                loader_spec=self._spec,
                prefetch_depth=self._config.prefetch_depth,
                injected_delay_s=self._config.injected_delay_s.get(rank, 0.0),
                coordinator_name=self._config.name,
                deferred_states=True,
            )
        )

    def _rank_actor_name(self, rank: int) -> str:
        """Listed in :meth:`status` so operators (and tests) can find a rank actor.

        ``<coordinator name>.<instance>.rank<r>.<replacements so far>``.
        """
        return f"{self._config.name}.{self._instance}.rank{rank}.{self._restarts[rank]}"

    async def _redeliver(self, step: int) -> list[Any]:
        """Pending step's refs, after every rank answered and every replacement caught up."""
        await asyncio.gather(*(self._caught_up(r, check_alive=True) for r in range(len(self._ranks))))
        return self._hand_out(step)

    def _hand_out(self, step: int) -> list[Any]:
        """One ref per DP rank: the shard refs (D = G) or merge tasks over them, made once per
        set of shard refs (a rank that re-produced its batch gets its DP rank a new merge)."""
        shard_refs = tuple(self._pending[step][0])
        if self._dp == len(shard_refs):
            return list(shard_refs)
        made = self._dp_refs.get(step)
        if made is None or made[0] != shard_refs:
            refs = [
                _merge_shards.remote(self._merge_spec, *(shard_refs[s] for s in shards))
                for shards in shard_assignment(len(shard_refs), self._dp)
            ]
            made = self._dp_refs[step] = (shard_refs, refs)
        return list(made[1])

    async def _next_batch(self, rank: int, step: int) -> tuple[Any, dict[str, Any]]:
        """Rank's batch ref and following state for ``step``, replacing the rank if it died."""
        while True:
            await self._caught_up(rank)
            try:
                if rank not in self._next_calls:  # kept across a timeout so a retry does not skip
                    self._next_calls[rank] = self._ranks[rank].next_batch.remote()
                batch_ref, state_ref = self._next_calls[rank]
                doing = f"producing the batch for step {step}"
                return batch_ref, await self._await(state_ref, self._config.step_timeout_s, rank, doing)
            except RayActorError as error:
                self._replace(rank, error)

    async def _caught_up(self, rank: int, *, check_alive: bool = False) -> None:
        """Return once rank's actor is restored and has re-produced every pending step."""
        while True:
            try:
                if check_alive and rank not in self._recoveries:
                    call = self._ranks[rank].status.remote()
                    await self._await(call, self._config.control_timeout_s, rank, "answering a liveness check")
                await self._finish_recovery(rank)
                return
            except RayActorError as error:
                self._replace(rank, error)

    async def _finish_recovery(self, rank: int) -> None:
        recovery = self._recoveries.get(rank)
        if recovery is None:
            return
        actor = self._ranks[rank]
        if recovery.restore is not None:
            doing = "restoring the last committed state"
            await self._await(recovery.restore, self._config.control_timeout_s, rank, doing)
            recovery.restore = None
        while recovery.step <= self._handed_step:
            if recovery.call is None:  # kept across a timeout: the retry waits for the same batch
                recovery.call = actor.next_batch.remote()
            batch_ref, state_ref = recovery.call
            doing = f"re-producing the batch for step {recovery.step}"
            state = await self._await(state_ref, self._config.step_timeout_s, rank, doing)
            if recovery.step in self._pending:  # else committed meanwhile: nothing to replace
                self._pending[recovery.step][0][rank] = batch_ref
                self._pending[recovery.step][1][rank] = state
            recovery.step, recovery.call = recovery.step + 1, None
        del self._recoveries[rank]
        self._metrics.record_restore("rank_recovery")

    def _replace(self, rank: int, cause: BaseException) -> None:
        """New actor in the same bundle, restoring the last commit; it catches up before serving."""
        actor = self._respawn(rank, cause, "serving steps")
        restore = actor.load_state_dict.remote(self._committed_states[rank])
        self._recoveries[rank] = _Recovery(restore=restore, step=self._committed_step + 1)

    def _renew_ranks(self) -> None:
        """A rewind: kill every rank actor and start fresh ones (new names, nothing restored, no
        death counted); every outstanding call and recovery is dropped with the old actors."""
        for actor in self._ranks:
            ray.kill(actor, no_restart=True)
        self._next_calls.clear()
        self._recoveries.clear()
        self._instance = os.urandom(3).hex()  # the old names are freed asynchronously
        self._ranks = [self._spawn(rank) for rank in range(len(self._ranks))]

    def _respawn(self, rank: int, cause: BaseException, during: str) -> Any:
        """Count the death of rank's actor and start a fresh one in its bundle (nothing restored)."""
        self._next_calls.pop(rank, None)
        self._recoveries.pop(rank, None)
        count_rank_death(self._restarts, rank, self._config.max_rank_restarts, cause, f" (while {during})")
        ray.kill(self._ranks[rank], no_restart=True)
        self._ranks[rank] = self._spawn(rank)
        return self._ranks[rank]

    async def _await(self, ref: Any, timeout: float, rank: Optional[int], doing: str) -> Any:
        """The value of a small object ref, with errors that name the rank and what it was doing."""
        try:
            return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout)
        except asyncio.TimeoutError:
            if rank is None:
                raise RankTimeoutError(
                    f"the coordinator did not finish {doing} within {timeout:g} s; check that the "
                    "cluster has these resources free"
                ) from None
            raise RankTimeoutError(f"rank {rank} did not finish {doing} within {timeout:g} s{await self._diagnose(rank)}") from None
        except RayTaskError as error:
            raise RankFailedError(f"rank {rank} failed while {doing}: {error.cause!r}") from None

    async def _diagnose(self, rank: int) -> str:
        """Why a rank may be late: its bundle has no node, or what the actor reports; plus advice."""
        unplaced = self._placement.unplaced_bundle(rank)
        if unplaced is not None:
            return f" ({unplaced})"
        advice = "; raise step_timeout_s/control_timeout_s if it is only slow, otherwise inspect that actor"
        try:
            status = await asyncio.wait_for(asyncio.wrap_future(self._ranks[rank].status.remote().future()), 5)
        except (asyncio.TimeoutError, RayActorError) as error:
            return f" (it does not answer status calls either: {type(error).__name__}){advice}"
        return (
            f" (it has been {status['activity']} for {status['activity_seconds']:g} s; produced "
            f"{status['produced']} batches, {status['ready']} ready, pid {status['pid']}){advice}"
        )


@ray.remote(num_cpus=0)
def _merge_shards(spec: dict[str, Any], *batches: Any) -> Any:
    """One DP rank's batch: the shard batches merged in order (a task, so data skips the coordinator)."""
    from rl_data.distributed.shard_merge import MergeSpec, merge_shard_batches

    return merge_shard_batches(MergeSpec.from_json(spec), batches)


def layout_fix(saved: dict[str, Any]) -> str:
    """What to do about a changed placement layout, naming the saved number of logical shards."""
    shards = saved.get("logical_world_size")
    if not isinstance(shards, int) or shards < 1:
        return "restore with the data layout the checkpoint was saved with"
    divisors = [d for d in range(1, shards + 1) if shards % d == 0]
    return (
        f"the checkpoint holds {shards} logical data shards: restore with logical_world_size={shards}, "
        f"the same bundles and strategy; parallel_layout.dp may be any of {divisors}"
    )


def _check_checkpoint_structure(state: dict[str, Any]) -> None:
    """Refuse a coordinator checkpoint whose parts are missing or of the wrong type (a clear
    ``ValueError``, never a ``KeyError`` from deep inside the restore)."""
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


def start_data_coordinator(
    config: RuntimeConfig,
    loader_spec: LoaderSpec,
    *,
    placement_group: Any = None,
    bundle_of_rank: Optional[Sequence[int]] = None,
) -> Any:
    """Create the named coordinator actor, wait until every rank is ready; return its handle."""
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
