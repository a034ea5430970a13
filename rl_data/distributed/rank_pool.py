"""``RankPool``: the rank actors of one data coordinator or prompt feed, supervised.

One :class:`~rl_data.distributed.rank_actor.RankActor` per logical rank, each in its bundle of
one placement group. The pool holds what both owners need of their ranks; the owner keeps its
own books (the coordinator's steps, the feed's prompt ledger):

* **Placement.** A group it creates is named after its owner
  (:func:`~rl_data.distributed.placement.placement_group_name`); an owner holding its actor name
  first removes a group of that name left by a predecessor that died without ``shutdown``. A
  framework's group is adopted instead (``placement_group``, ``bundle_of_rank``).
* **Names.** ``<owner name>.<instance>.rank<r>.<deaths of rank r>`` (:func:`rank_actor_name`):
  a replacement gets a fresh name, since ``ray.kill`` frees the old one asynchronously.
* **Deaths.** :meth:`RankPool.replace` counts a rank's death (:func:`count_rank_death`: past
  ``max_rank_restarts`` it raises :class:`RankFailedError`) and starts a fresh actor in its
  bundle, nothing restored. A rewind keeps the actors: :meth:`RankPool.restore_rank` loads the
  checkpoint into each live rank (``RankActor.load_state_dict`` rebuilds its loader); a rank that
  died, or does not finish within ``control_timeout_s``, is replaced and restored.
* **Calls.** :meth:`RankPool.wait` awaits a rank's reply within a timeout; a timeout says what
  the rank was doing and why it may be late (:class:`RankTimeoutError`), a failure names the rank
  (:class:`RankFailedError`). :meth:`RankPool.ready` waits once for the bundles and every rank's
  initial loader state.
* **Restores.** One at a time (:meth:`RankPool.restore_slot`); one that fails part way refuses
  the owner's calls until a restore succeeds (:meth:`RankPool.restoring`,
  :func:`refuse_if_restore_failed`). A checkpoint of another placement layout, number of ranks
  or loader identity is refused before anything changes (:func:`check_rank_checkpoint`, pure).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Optional

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError

from rl_data.distributed.config import LoaderSpec, RuntimeConfig
from rl_data.distributed.placement import (
    RankPlacement,
    adopt_placement_group,
    create_rank_placement,
    remove_leftover_placement_group,
)
from rl_data.distributed.rank_actor import COMPLETION_KEY, RankActor, without_completion_key
from rl_data.distributed.ray_memory import objects_in_memory
from rl_data.energon.identity import REWEIGHT_HINT, check_restorable
from rl_data.fingerprint import differences
logger = logging.getLogger(__name__)

#: Seconds a rank has to answer a status call (``status``, a late rank's diagnosis).
STATUS_TIMEOUT_S = 10.0
#: Ray's switch for its "blocking ray.get inside async actor" warning (off in a pool's process).
WARN_BLOCKING_GET_ENV = "RAY_WARN_BLOCKING_GET_INSIDE_ASYNC"
#: :class:`RankActor` as a Ray actor class, made once: every ``ray.remote(cls)`` call builds a new
#: class (a subclass, its methods wrapped, their signatures: ~25 KB of Python objects) that a process
#: keeps for good once it started an actor of it, so a class per replacement grows the owner at every death.
REMOTE_RANK_ACTOR = ray.remote(RankActor)


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


def rank_actor_name(owner: str, instance: str, rank: int, deaths: int) -> str:
    """``<owner>.<instance>.rank<rank>.<deaths>``: unique per actor of one pool."""
    return f"{owner}.{instance}.rank{rank}.{deaths}"


def check_rank_checkpoint(
    saved_layout: Mapping[str, Any],
    layout: Mapping[str, Any],
    saved_identities: Sequence[Any],
    identities: Sequence[Any],
    *,
    owner: str,
    reweight: bool = False,
    reweight_hint: str = REWEIGHT_HINT,
) -> None:
    """Refuse (``ValueError``) rank states saved with another placement layout, another number of
    ranks or another loader identity than the current ones; with ``reweight``, changed mixture
    weights alone are accepted, without it their refusal ends with ``reweight_hint``."""
    lines = differences(saved_layout, layout)
    if lines:
        raise ValueError("Placement layout changed: " + "; ".join(lines) + "; " + layout_fix(dict(saved_layout)))
    if len(saved_identities) != len(identities):
        raise ValueError(
            f"{owner} checkpoint holds {len(saved_identities)} rank states for logical world size "
            f"{len(identities)}; the checkpoint is damaged"
        )
    for rank, (saved, current) in enumerate(zip(saved_identities, identities)):
        check_restorable(saved, current, reweight=reweight, where=f"rank {rank}: ", reweight_hint=reweight_hint)


def holds_actor_name(name: str, namespace: str) -> bool:
    """Whether the calling actor is the one registered as ``name`` in ``namespace``."""
    try:
        holder = ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    return holder._actor_id.hex() == ray.get_runtime_context().get_actor_id()


def spawn_rank_actor(
    config: RuntimeConfig,
    spec: LoaderSpec,
    placement: RankPlacement,
    rank: int,
    actor_name: str,
    *,
    deferred_states: bool = False,
) -> Any:
    """A new :class:`RankActor` for ``rank`` in its bundle, named ``actor_name`` (nothing restored).

    Its metrics are tagged ``coordinator=config.name``; ``deferred_states``: see ``RankActor``.
    """
    return (
        REMOTE_RANK_ACTOR.options(
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
            deferred_states=deferred_states,
        )
    )


class RankPool:
    """The rank actors of the owner ``config.name`` (``owner``: "coordinator", "feed"; see the module doc).

    Runs inside the owner's async actor. :meth:`replace` starts an actor without waiting, so a
    worker thread may call it too (the feed's producers do).
    """

    def __init__(
        self,
        config: RuntimeConfig,
        spec: LoaderSpec,
        *,
        owner: str,
        placement_group: Any = None,
        bundle_of_rank: Optional[Sequence[int]] = None,
        deferred_states: bool = False,
    ) -> None:
        # Ray's "blocking ray.get inside async actor" warning is wrong in this process: the pool
        # (wait_all) and its owners (the feed's producers) call ray.get only in worker threads, never
        # on the event loop, and Ray warns whatever the thread. Off unless the user set it, as Ray
        # Train's controller does.
        os.environ.setdefault(WARN_BLOCKING_GET_ENV, "0")
        self.config, self.owner = config, owner
        self._spec, self._deferred_states = spec, deferred_states
        if placement_group is None:
            if holds_actor_name(config.name, config.namespace):  # so no live owner of this name uses that group
                remove_leftover_placement_group(config)
            self.placement = create_rank_placement(config)
        else:
            self.placement = adopt_placement_group(placement_group, bundle_of_rank or (), config)
        self.restarts = [0] * config.world_size
        self._instance = os.urandom(3).hex()  # names never collide with a previous run's
        self._names = [""] * config.world_size
        self.actors = [self._spawn(rank) for rank in range(config.world_size)]
        #: every rank's loader state before its first batch, once :meth:`ready` returned
        self.initial_states: Optional[list[dict[str, Any]]] = None
        self._ready_lock = asyncio.Lock()
        self.restore_failure: Optional[str] = None
        self._restoring = False

    @property
    def world_size(self) -> int:
        return len(self.actors)

    @property
    def names(self) -> list[str]:
        """The actor name of every rank (listed in the owner's ``status``)."""
        return list(self._names)

    async def ready(self) -> list[dict[str, Any]]:
        """Once: wait for the bundles, then every rank's initial loader state (each within
        ``control_timeout_s``); return those states."""
        async with self._ready_lock:
            if self.initial_states is None:
                layout = self.placement.layout
                reserving = f"reserving the placement group (bundles {layout['bundles']}, {layout['strategy']})"
                await self.wait(self.placement.placement_group.ready(), None, reserving)
                states = [self.wait(a.state_dict.remote(), r, "building its loader") for r, a in enumerate(self.actors)]
                self.initial_states = list(await asyncio.gather(*states))
        return self.initial_states

    async def wait(
        self, ref: Any, rank: Optional[int], doing: str, timeout: Optional[float] = None, *, limit_s: Optional[float] = None
    ) -> Any:
        """The value of a small object ref of ``rank`` (None: of the owner), within ``timeout``
        (default ``control_timeout_s``), with errors that name the rank and what it was doing.
        A dead actor raises ``RayActorError`` (the caller decides whether to :meth:`replace` it).
        ``limit_s``: the limit a timeout error names (default ``timeout``), when most of it was waited before."""
        timeout = self.config.control_timeout_s if timeout is None else timeout
        limit = timeout if limit_s is None else limit_s
        try:
            return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout)
        except asyncio.TimeoutError:
            if rank is None:
                raise RankTimeoutError(
                    f"the {self.owner} did not finish {doing} within {limit:g} s; check that the "
                    "cluster has these resources free"
                ) from None
            raise RankTimeoutError(f"rank {rank} did not finish {doing} within {limit:g} s{await self._diagnose(rank)}") from None
        except RayTaskError as error:
            who = f"the {self.owner}" if rank is None else f"rank {rank}"
            raise RankFailedError(f"{who} failed while {doing}: {error.cause!r}") from None

    async def wait_all(self, refs: Sequence[Any], timeout: float) -> Optional[list[Any]]:
        """The values of small object refs through one batched ``ray.get`` in a thread (an asyncio
        wait per ref, as :meth:`wait`, costs ~0.2 ms more per ref). None when any of them failed or
        its actor died: wait for each with :meth:`wait` to learn which. Raises ``GetTimeoutError``
        (a ``TimeoutError``) when they were not all ready within ``timeout``."""
        try:
            return await asyncio.get_running_loop().run_in_executor(None, lambda: ray.get(list(refs), timeout=timeout))
        except GetTimeoutError:
            raise
        except RayError:
            return None

    async def complete_states(self, states: Sequence[dict[str, Any]], of: str) -> tuple[list[dict[str, Any]], int]:
        """``states`` (``of``: e.g. "step 7") with every deferred one completed by its rank, and how
        many stayed as handed out: a rank that cannot (replaced since, or not answering within the
        control timeout) leaves its state as it is (exact: a restore from it encodes more)."""
        completed = list(states)
        deferred = [rank for rank, state in enumerate(states) if COMPLETION_KEY in state]
        calls = [self.actors[rank].complete_state.remote(states[rank]) for rank in deferred]
        results = await asyncio.gather(
            *(self.wait(call, rank, "completing its state for a checkpoint") for rank, call in zip(deferred, calls)),
            return_exceptions=True,
        )
        kept = 0
        for rank, result in zip(deferred, results):
            if isinstance(result, BaseException):
                logger.warning(
                    "rank %d did not complete its state of %s (%s); the checkpoint keeps it as handed out "
                    "(exact; its restore encodes the packing buffers' samples again)", rank, of, result,
                )
                result, kept = without_completion_key(states[rank]), kept + 1
            completed[rank] = result
        return completed, kept

    def replace(self, rank: int, cause: BaseException, during: str = "") -> Any:
        """Count the death of rank's actor (``during``: what it was doing) and start a fresh one in
        its bundle (nothing restored); return it."""
        count_rank_death(self.restarts, rank, self.config.max_rank_restarts, cause, f" (while {during})" if during else "")
        ray.kill(self.actors[rank], no_restart=True)
        self.actors[rank] = self._spawn(rank)
        return self.actors[rank]

    async def restore_rank(self, rank: int, state: dict[str, Any], reweight: bool = False) -> None:
        """Load ``state`` into rank's actor (fresh, or live: a rewind), replacing it if it died or
        did not finish within ``control_timeout_s`` (a death counted either way)."""
        while True:
            try:
                call = self.actors[rank].load_state_dict.remote(state, reweight)
                await self.wait(call, rank, "restoring its checkpoint state")
                return
            except (RayActorError, RankTimeoutError) as error:
                self.replace(rank, error, "restoring a checkpoint")

    def check_checkpoint(
        self, saved_layout: Mapping[str, Any], saved_identities: Sequence[Any], *, reweight: bool = False,
        reweight_hint: str = REWEIGHT_HINT,
    ) -> None:  # fmt: skip
        """:func:`check_rank_checkpoint` against this pool's layout and its ranks' identities (after :meth:`ready`)."""
        identities = [state.get("identity") for state in self.initial_states or ()]
        check_rank_checkpoint(
            saved_layout, self.placement.layout, saved_identities, identities,
            owner=self.owner, reweight=reweight, reweight_hint=reweight_hint,
        )  # fmt: skip

    @contextlib.contextmanager
    def restore_slot(self, call: str) -> Iterator[None]:
        """Hold the pool's one restore slot for ``call``; refuse a second restore instead of queueing it."""
        if self._restoring:
            raise RuntimeError(
                f"{call} refused: another restore of this {self.owner} is in flight; expected one restore "
                "at a time: wait for the first one to return (it raises if it failed), then restore "
                "again if needed (with several consumers, one restores and the others wait for it)"
            )
        self._restoring = True
        try:
            yield
        finally:
            self._restoring = False

    @contextlib.contextmanager
    def restoring(self, what: str) -> Iterator[None]:
        """Mark the restore of ``what`` (e.g. "the checkpoint of step 3") in progress: until it
        finishes, and for good if it raises, :meth:`refuse_if_restore_failed` refuses."""
        self.restore_failure = f"restoring {what} did not finish"
        try:
            yield
        except BaseException as error:
            self.restore_failure = f"restoring {what} failed: {error}"
            raise
        self.restore_failure = None

    def refuse_if_restore_failed(self, call: str) -> None:
        refuse_if_restore_failed(self.restore_failure, call)

    async def status(self) -> dict[str, Any]:
        """``placement_fingerprint``, ``restarts``, ``restore_failure``, ``rank_actor_names``,
        ``ranks`` (every rank's own status; one that does not answer is marked) and
        ``objects_in_memory`` (the objects in this process's Ray store: batches below Ray's 100 KB
        inline limit and markers of larger ones; a number that grows with the steps is a leak)."""
        actors = list(self.actors)
        replies = await asyncio.gather(
            *(asyncio.wait_for(asyncio.wrap_future(a.status.remote().future()), STATUS_TIMEOUT_S) for a in actors),
            return_exceptions=True,
        )
        ranks = []
        for rank, reply in enumerate(replies):
            if isinstance(reply, (asyncio.TimeoutError, RayActorError)):
                reply = {"rank": rank, "activity": f"not answering ({type(reply).__name__})"}
            elif isinstance(reply, BaseException):
                raise reply
            ranks.append(reply)
        return {
            "placement_fingerprint": self.placement.fingerprint,
            "restarts": list(self.restarts),
            "restore_failure": self.restore_failure,
            "rank_actor_names": self.names,
            "ranks": ranks,
            "objects_in_memory": objects_in_memory(),
        }

    def shutdown(self) -> None:
        """Kill the rank actors and remove the placement group if the pool created it."""
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.placement.release()

    async def _diagnose(self, rank: int) -> str:
        """Why a rank may be late: its bundle has no node, or what the actor reports; plus advice."""
        unplaced = self.placement.unplaced_bundle(rank)
        if unplaced is not None:
            return f" ({unplaced})"
        advice = "; raise step_timeout_s/control_timeout_s if it is only slow, otherwise inspect that actor"
        try:
            status = await asyncio.wait_for(asyncio.wrap_future(self.actors[rank].status.remote().future()), 5)
        except (asyncio.TimeoutError, RayActorError) as error:
            return f" (it does not answer status calls either: {type(error).__name__}){advice}"
        return (
            f" (it has been {status['activity']} for {status['activity_seconds']:g} s; produced "
            f"{status['produced']} batches, {status['ready']} ready, pid {status['pid']}){advice}"
        )

    def _spawn(self, rank: int) -> Any:
        name = rank_actor_name(self.config.name, self._instance, rank, self.restarts[rank])
        self._names[rank] = name
        return spawn_rank_actor(self.config, self._spec, self.placement, rank, name, deferred_states=self._deferred_states)
