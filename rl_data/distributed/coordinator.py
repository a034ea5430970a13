"""``DataCoordinator``: hands out each training step's batches and checkpoints exactly once.

A named async actor (``config.name`` in ``config.namespace``) that creates one
:class:`RankActor` per logical rank in its placement-group bundle.

Ownership, decided deliberately: the coordinator *calls* ``RankActor.next_batch``, so it owns
every batch handed out (and the small state that follows it) until the step is committed.
Those objects live in the object store of the producer's node, not in the producer process,
so they survive a rank actor's death; the coordinator never fetches a batch (only the state,
a few KB). Batches below Ray's inline threshold (100 KB) travel inside the task reply and sit
in the coordinator's memory until commit; larger ones stay in the object store. The trainer
borrows the refs returned by :meth:`next_step` and keeps them alive as long as it needs.

Exactly once: ``commit(k)`` stores, per rank, the loader state that followed step k's batch;
``state_dict()`` is that checkpoint. A rank that dies is recreated in its bundle, restored
from the last committed state, and re-produces the steps handed out since, identically.

Elastic resume (later): ``next_step`` returns one ref per logical shard; today shard r is the
batch of DP rank r. The shard -> DP-rank mapping belongs here, not in rank actors or loaders.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import threading
import time
from typing import Any, Optional, Sequence

import ray
from ray.exceptions import RayActorError, RayTaskError

from rl_data.distributed.checkpoint_files import checkpoint_path, load_checkpoint_file, save_checkpoint_file
from rl_data.distributed.config import LoaderSpec, RuntimeConfig
from rl_data.distributed.metrics import CoordinatorMetrics
from rl_data.distributed.placement import RankPlacement, adopt_placement_group, create_rank_placement
from rl_data.distributed.rank_actor import RankActor

CHECKPOINT_FORMAT = "rl_data.distributed.coordinator"
CHECKPOINT_FORMAT_VERSION = 1


class RankTimeoutError(TimeoutError):
    """A rank actor delivered nothing within its timeout."""


class RankFailedError(RuntimeError):
    """A rank actor failed (its loader raised, or it died more often than allowed)."""


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
        if not self._committed_states:  # a concurrent call may have finished first
            self._committed_states = list(states)

    async def next_step(self, commit: Optional[int] = None) -> tuple[int, list[Any]]:
        """Step k and one batch ref per logical rank (refs are handed out, data is never fetched).

        ``commit``: first :meth:`commit` that step, so a trainer needs one round trip per
        step: ``next_step(commit=k)`` once step k is trained.
        """
        if commit is not None:
            await self.commit(commit)
        started = time.monotonic()
        await self._ensure_ready()
        async with self._lock:
            step = self._handed_step + 1
            results = await asyncio.gather(
                *(self._next_batch(r, step) for r in range(len(self._ranks))), return_exceptions=True
            )
            failures = [r for r in results if isinstance(r, BaseException)]
            if failures:  # every rank finished or timed out: nothing runs on in the background
                raise failures[0]
            self._next_calls.clear()
            self._pending[step] = ([ref for ref, _ in results], [state for _, state in results])
            self._handed_step = step
            self._metrics.record_step(time.monotonic() - started)
            return step, [ref for ref, _ in results]

    async def commit(self, step: int) -> None:
        """Record that the trainer consumed every step up to and including ``step``."""
        async with self._lock:
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
            self._committed_step = step
            self._metrics.record_committed(step)

    async def state_dict(self) -> dict[str, Any]:
        """The checkpoint for the last committed step (loads with ``torch.load(weights_only=True)``)."""
        await self._ensure_ready()
        return {
            "format": CHECKPOINT_FORMAT,
            "format_version": CHECKPOINT_FORMAT_VERSION,
            "step": self._committed_step,
            "placement": {"fingerprint": self._placement.fingerprint, "layout": self._placement.layout},
            "ranks": list(self._committed_states),
        }

    async def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore every rank from a checkpoint; only before the first step.

        Refuses (``ValueError``, nothing restored) another format, another placement layout
        and any rank whose loader identity differs, listing the differences.
        """
        from rl_data.energon.identity import _identity_differences

        await self._ensure_ready()
        async with self._lock:
            if self._handed_step or self._next_calls:
                raise RuntimeError(
                    f"load_state_dict after step {self._handed_step} was handed out; restore a "
                    "checkpoint into a fresh coordinator, before its first next_step"
                )
            if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
                found = state.get("format") if isinstance(state, dict) else type(state).__name__
                raise ValueError(f"not a data coordinator checkpoint: format {found!r}, expected {CHECKPOINT_FORMAT!r}")
            if state.get("format_version") != CHECKPOINT_FORMAT_VERSION:
                raise ValueError(
                    f"coordinator checkpoint format version {state.get('format_version')!r}; this "
                    f"version reads {CHECKPOINT_FORMAT_VERSION}"
                )
            lines = _identity_differences(state["placement"]["layout"], self._placement.layout)
            if lines:
                raise ValueError(
                    "Placement layout changed: " + "; ".join(lines) + "; restore with the "
                    "layout (world size, bundles, strategy, parallel sizes) the checkpoint was saved with"
                )
            if len(state["ranks"]) != len(self._ranks):
                raise ValueError(
                    f"checkpoint holds {len(state['ranks'])} rank states for logical world size "
                    f"{len(self._ranks)}; the checkpoint is damaged"
                )
            for rank, (saved, current) in enumerate(zip(state["ranks"], self._committed_states)):
                lines = _identity_differences(saved.get("identity"), current.get("identity"))
                if lines:
                    raise ValueError(f"rank {rank}: Energon loader identity changed: " + "; ".join(lines))
            timeout = self._config.control_timeout_s
            await asyncio.gather(
                *(
                    self._await(actor.load_state_dict.remote(saved), timeout, rank, "restoring its checkpoint state")
                    for rank, (actor, saved) in enumerate(zip(self._ranks, state["ranks"]))
                )
            )
            self._committed_states = list(state["ranks"])
            self._committed_step = self._handed_step = int(state["step"])
            self._metrics.record_restore("checkpoint")
            self._metrics.record_committed(self._committed_step)

    async def save_checkpoint(self, directory: str) -> str:
        """Write :meth:`state_dict` atomically to ``directory`` (on this actor's node)."""
        return str(save_checkpoint_file(checkpoint_path(directory), await self.state_dict()))

    async def load_checkpoint(self, directory: str) -> int:
        """Load a checkpoint written by :meth:`save_checkpoint`; return its step."""
        state = load_checkpoint_file(checkpoint_path(directory))
        await self.load_state_dict(state)
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
            "restarts": list(self._restarts),
            "rank_actor_names": [self._rank_actor_name(r) for r in range(len(self._ranks))],
            "ranks": ranks,
        }

    async def shutdown(self) -> None:
        """Kill the rank actors and remove the placement group if this coordinator made it."""
        for actor in self._ranks:
            ray.kill(actor, no_restart=True)
        self._placement.release()

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
            )
        )

    def _rank_actor_name(self, rank: int) -> str:
        """Listed in :meth:`status` so operators (and tests) can find a rank actor.

        ``<coordinator name>.<instance>.rank<r>.<replacements so far>``.
        """
        return f"{self._config.name}.{self._instance}.rank{rank}.{self._restarts[rank]}"

    async def _next_batch(self, rank: int, step: int) -> tuple[Any, dict[str, Any]]:
        """Rank's batch ref and following state for ``step``, replacing the rank if it died."""
        died: Optional[BaseException] = None
        while True:
            try:
                if died is not None:
                    await self._replace_rank(rank, died)
                    died = None
                if rank not in self._next_calls:  # kept across a timeout so a retry does not skip
                    self._next_calls[rank] = self._ranks[rank].next_batch.remote()
                batch_ref, state_ref = self._next_calls[rank]
                doing = f"producing the batch for step {step}"
                return batch_ref, await self._await(state_ref, self._config.step_timeout_s, rank, doing)
            except RayActorError as error:
                self._next_calls.pop(rank, None)
                died = error

    async def _replace_rank(self, rank: int, cause: BaseException) -> None:
        """New actor in the same bundle, restored to the last commit, re-producing pending steps."""
        self._restarts[rank] += 1
        if self._restarts[rank] > self._config.max_rank_restarts:
            raise RankFailedError(
                f"rank {rank} died {self._restarts[rank]} times, more than max_rank_restarts="
                f"{self._config.max_rank_restarts}; last cause: {str(cause).splitlines()[0]}"
            ) from None
        ray.kill(self._ranks[rank], no_restart=True)
        actor = self._spawn(rank)
        self._ranks[rank] = actor
        timeout = self._config.control_timeout_s
        await self._await(actor.load_state_dict.remote(self._committed_states[rank]), timeout, rank, "restoring the last committed state")
        self._metrics.record_restore("rank_recovery")
        for step in range(self._committed_step + 1, self._handed_step + 1):
            batch_ref, state_ref = actor.next_batch.remote()
            state = await self._await(state_ref, self._config.step_timeout_s, rank, f"re-producing the batch for step {step}")
            self._pending[step][0][rank] = batch_ref
            self._pending[step][1][rank] = state

    async def _await(self, ref: Any, timeout: float, rank: Optional[int], doing: str) -> Any:
        """The value of a small object ref, with errors that name the rank and what it was doing."""
        try:
            return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout)
        except asyncio.TimeoutError:
            where = "the coordinator" if rank is None else f"rank {rank}"
            detail = "" if rank is None else await self._describe(rank)
            advice = (
                "raise step_timeout_s/control_timeout_s if it is only slow, otherwise inspect that actor"
                if rank is not None
                else "check that the cluster has these resources free"
            )
            raise RankTimeoutError(f"{where} did not finish {doing} within {timeout:g} s{detail}; {advice}") from None
        except RayTaskError as error:
            raise RankFailedError(f"rank {rank} failed while {doing}: {error.cause!r}") from None

    async def _describe(self, rank: int) -> str:
        try:
            status = await asyncio.wait_for(asyncio.wrap_future(self._ranks[rank].status.remote().future()), 5)
        except (asyncio.TimeoutError, RayActorError) as error:
            return f" (it does not answer status calls either: {type(error).__name__})"
        return (
            f" (it has been {status['activity']} for {status['activity_seconds']:g} s; produced "
            f"{status['produced']} batches, {status['ready']} ready, pid {status['pid']})"
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
        .options(name=config.name, namespace=config.namespace, num_cpus=0, max_restarts=0)
        .remote(config, loader_spec, placement_group, bundle_of_rank)
    )
    try:
        ray.get(handle.ready.remote(), timeout=config.control_timeout_s + 30)
    except BaseException:
        ray.kill(handle, no_restart=True)
        raise
    return handle
