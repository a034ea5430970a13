"""``RankActor``: one logical data-parallel rank's loader, prefetching in the background.

The actor is async: loader work runs on one executor thread, so ``status``, ``state_dict`` and
``shutdown`` answer while a batch is being produced. Every produced batch is kept together with
the loader state that follows it, and ``next_batch`` returns both as two separate objects: the
*caller* owns them (Ray's ownership rule for return values), so a batch already handed out
survives this actor's death, and the caller can commit exactly the state after the batches a
trainer consumed. Prefetched batches not yet handed out die with the actor; a replacement
restored from the last committed state produces them again, identically.

With ``deferred_states`` (the coordinator's ranks), those states leave out what only makes a
restore faster (packed: the packing buffers' encoded samples, most of a packed state's cost and
~0.5 MB of it): they are as exact, and :meth:`RankActor.complete_state` adds it for the state a
checkpoint saves, while this actor still holds that state (:data:`COMPLETABLE_HANDED_OUT_STATES`).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import gc
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import ray

from rl_data.batch_stats import BatchStats
from rl_data.distributed.config import LoaderSpec
from rl_data.distributed.metrics import RankMetrics
from rl_data.energon.identity import _V2_STATE_FORMAT_VERSION, LOADER_STATE_FORMAT


logger = logging.getLogger(__name__)

#: A rank warns once when more than this share of the samples it handed out carry no loss
#: (over the sequence length, cut to stubs), after at least ``ZERO_LOSS_WARNING_MIN_SAMPLES``.
ZERO_LOSS_WARNING_SHARE = 0.05
ZERO_LOSS_WARNING_MIN_SAMPLES = 64
#: A rank with ``deferred_states`` can complete the states it prefetched and the last this many it
#: handed out (a coordinator commits a step or two behind the one it hands out).
COMPLETABLE_HANDED_OUT_STATES = 8
#: Key of a deferred state naming the rank actor that can complete it (and which of its states).
COMPLETION_KEY = "completable_by"


def without_completion_key(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` as a checkpoint keeps it when it was not completed (as exact; restores slower)."""
    return {key: value for key, value in state.items() if key != COMPLETION_KEY}


def loader_builder(spec: LoaderSpec) -> Callable[..., Any]:
    """What builds ``spec``'s loader for one logical shard: the task's own ``build_loader`` (a task
    that reads no Energon dataset), else :func:`rl_data.energon.sft_dataloader.build_loader`
    (imported only then: it imports torch and Energon)."""
    if spec.task().build_loader is not None:
        return spec.task().build_loader
    from rl_data.energon.sft_dataloader import build_loader

    return build_loader


class DataExhaustedError(RuntimeError):
    """A validation split has no further batch for this rank."""


class RankRewoundError(RuntimeError):
    """The rank was rewound while a ``next_batch`` call waited; the call gets no batch."""


class _Produced:
    __slots__ = ("batch", "state", "complete", "stats", "skipped_samples", "filtered_samples")

    def __init__(
        self,
        batch: Any,
        state: dict[str, Any],
        complete: Callable[[], dict[str, Any]] | None,
        stats: BatchStats,
        skipped_samples: int,
        filtered_samples: int,
    ) -> None:
        self.batch, self.state, self.complete = batch, state, complete
        self.stats, self.skipped_samples, self.filtered_samples = stats, skipped_samples, filtered_samples


class RankActor:
    """Produces the batches of logical rank ``rank`` of ``world_size`` (run as a Ray actor).

    Its metrics (``rl_data.distributed.metrics``) are tagged ``coordinator=coordinator_name``.
    Its state is its loader's (:mod:`rl_data.stateful`).
    """

    STATE_FORMAT, STATE_VERSION = LOADER_STATE_FORMAT, _V2_STATE_FORMAT_VERSION

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        placement_fingerprint: str,
        loader_spec: LoaderSpec,
        prefetch_depth: int,
        injected_delay_s: float = 0.0,
        coordinator_name: str = "",
        deferred_states: bool = False,
    ) -> None:
        build_loader = loader_builder(loader_spec)

        self.rank, self.world_size = rank, world_size
        self._split_role = loader_spec.split_role
        self._depth = prefetch_depth
        self._delay = injected_delay_s
        self._deferred_states = deferred_states
        self._instance = os.urandom(6).hex()  # completion keys never match another actor's states
        #: completion key -> how to complete that state (prefetched and recently handed-out ones)
        self._completions: collections.OrderedDict[str, Callable[[], dict[str, Any]]] = collections.OrderedDict()
        self._metrics = RankMetrics(coordinator_name, rank)
        self._task = loader_spec.task()
        processor = loader_spec.load_processor_factory()()
        tokenizer = getattr(processor, "tokenizer", processor)
        pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._merge_spec = self._task.merge_spec(self._task.config(loader_spec.data_config.task), pad_token_id or 0)
        # This process lives for its loader: freeze what the imports and the tokenizer left (~270,000
        # objects), so the full collections Energon runs while it builds the loader and when it
        # starts iterating skip them (0.1-0.25 s each here). Young garbage is collected first.
        gc.collect(1)
        gc.freeze()
        self._build_loader = functools.partial(
            build_loader,
            loader_spec,
            processor,
            logical_rank=rank,
            logical_world_size=world_size,
            placement_fingerprint=placement_fingerprint,
            task=self._task,
        )
        self._loader = self._build_loader()
        self._loader_restored = False  # a loader restores once: a second restore builds a new one
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"rank{rank}-loader")
        self._iterator: Optional[Any] = None
        self._ready: collections.deque[_Produced] = collections.deque()
        self._requested = 0  # next_batch calls so far
        self._produced = 0  # batches produced so far
        self._error: Optional[BaseException] = None
        self._handed_state: Optional[dict[str, Any]] = None
        self._handed_samples = self._zero_loss_samples = 0
        self._warned_zero_loss = False
        self._activity, self._since = "idle, not started", time.monotonic()
        self._changed: Optional[asyncio.Condition] = None
        self._producer: Optional[asyncio.Task] = None
        self._generation = 0  # rewinds so far: a next_batch that waited across one gets no batch

    async def merge_spec(self) -> dict[str, Any]:
        """How batches of this task merge across shards (``MergeSpec.to_json``)."""
        return self._merge_spec.to_json()

    async def load_state_dict(self, state: dict[str, Any], reweight: bool = False) -> None:
        """Restore the loader from a format-2 state (``reweight``: see
        ``EnergonSFTDataLoader.load_state_dict``): into this actor's loader while it is neither
        started nor restored, else a :meth:`rewind` (a new loader in this process: a loader
        restores once)."""
        if self._producer is not None or self._loader_restored:
            await self.rewind(state, reweight)
            return
        self._loader_restored = True  # set first: after a restore that failed halfway, a new loader too
        self._loader.load_state_dict(state, reweight=reweight)
        self._handed_state = self._loader.state_dict() if reweight else without_completion_key(state)

    async def rewind(self, state: dict[str, Any], reweight: bool = False) -> None:
        """Restore ``state`` into a newly built loader, dropping every batch produced and not handed
        out: a coordinator's (or feed's) rewind of a live rank, without a new actor (imports and the
        tokenizer stay, ~0.3 CPU-s for the loader instead of ~2.4 for a new actor; the old loader's
        Energon workers stop). ``next_batch`` calls waiting now
        raise :class:`RankRewoundError`; batches and states handed out before stay valid objects.
        The next batch is the one after ``state``, as in a fresh actor that loaded it.
        """
        self._set_activity("rewinding: waiting for the batch being produced")
        if self._producer is not None:
            self._producer.cancel()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, lambda: None)  # the loader thread finished its batch
        self._set_activity("rewinding: building a new loader")
        loader = await loop.run_in_executor(self._executor, self._build_loader)
        await loop.run_in_executor(self._executor, functools.partial(loader.load_state_dict, state, reweight=reweight))
        old, self._loader, self._loader_restored = self._loader, loader, True
        old.close()
        if self._changed is not None:
            async with self._changed:
                self._generation += 1
                self._changed.notify_all()
        self._changed = self._producer = self._iterator = self._error = None
        self._ready.clear()
        self._completions.clear()
        self._requested = self._produced = 0
        self._handed_state = self._loader.state_dict() if reweight else without_completion_key(state)
        self._set_activity("idle, rewound")

    async def state_dict(self) -> dict[str, Any]:
        """The loader state after the last batch handed out (before the first: the initial one),
        as handed out (with ``deferred_states``: deferred, see :meth:`complete_state`).

        Answers while a batch is being produced: it never touches the loader once started.
        """
        if self._handed_state is None:
            self._handed_state = self._loader.state_dict()
        return self._handed_state

    async def complete_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state``, one this actor handed out, with what a deferred state left out; when this
        actor no longer holds it (or never did), ``state`` without its completion key."""
        key = state.get(COMPLETION_KEY)
        complete = self._completions.get(key) if isinstance(key, str) else None
        if complete is None:
            return without_completion_key(state)
        # beside the loader's thread: a checkpoint does not wait for the batch being produced
        return await asyncio.to_thread(complete)

    async def start(self) -> None:
        """Start producing in the background: the first batch at once, then (from the second
        request on) up to ``prefetch_depth`` ahead."""
        if self._producer is None:
            if self._handed_state is None:
                self._handed_state = self._loader.state_dict()
            self._changed = asyncio.Condition()
            self._producer = asyncio.get_running_loop().create_task(self._produce_forever())

    @ray.method(num_returns=2)
    async def next_batch(self) -> tuple[Any, dict[str, Any]]:
        """The next batch and the loader state right after it (two objects, caller-owned).

        Batches are handed out in the order the calls start; a caller that needs a strict
        order (the coordinator) waits for one call before making the next.
        """
        await self.start()
        async with self._changed:
            self._requested += 1
            self._changed.notify_all()
            waiting_since, generation = time.monotonic(), self._generation
            await self._changed.wait_for(lambda: self._ready or self._error is not None or self._generation != generation)
            if self._generation != generation:
                raise RankRewoundError(f"rank {self.rank} was rewound while this next_batch waited; ask again")
            if not self._ready:
                raise self._error
            produced = self._ready.popleft()
            self._handed_state = produced.state
            self._changed.notify_all()
        waited_s = time.monotonic() - waiting_since
        self._metrics.record_handed_out(produced.stats, waited_s=waited_s, ready=len(self._ready))
        self._count_zero_loss(produced.stats)
        return produced.batch, produced.state

    async def status(self) -> dict[str, Any]:
        """What this rank is doing right now (answers while a batch is being produced)."""
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "activity": self._activity,
            "activity_seconds": round(time.monotonic() - self._since, 3),
            "produced": self._produced,
            "handed_out": self._produced - len(self._ready),
            "ready": len(self._ready),
            "prefetch_depth": self._depth,
            "skipped_samples": self._loader.skipped_samples,
            "dropped_samples": self._loader.dropped_samples,
            "filtered_samples": self._loader.filtered_samples,
            "handed_out_samples": self._handed_samples,
            "zero_loss_samples": self._zero_loss_samples,
            # a mixture's batches, samples per member and weight history, as handed out
            "mixture": (self._handed_state or {}).get("mixture"),
        }

    def _count_zero_loss(self, stats: BatchStats) -> None:
        """Count handed-out samples without loss; warn once when they are a large share."""
        self._handed_samples += stats.samples
        self._zero_loss_samples += stats.zero_loss_samples
        share = self._zero_loss_samples / self._handed_samples if self._handed_samples else 0.0
        if (
            not self._warned_zero_loss
            and self._handed_samples >= ZERO_LOSS_WARNING_MIN_SAMPLES
            and share > ZERO_LOSS_WARNING_SHARE
        ):
            self._warned_zero_loss = True
            logger.warning(
                "rank %d: %d of the first %d samples (%.0f%%) were over max_sequence_length, cut to "
                "stubs and carry loss_multiplier 0 (no training signal); raise max_sequence_length or "
                "filter long samples in preprocess (--max-tokens)",
                self.rank, self._zero_loss_samples, self._handed_samples, 100 * share,
            )

    async def shutdown(self) -> None:
        """Stop the background producer; the executor thread is abandoned, not joined."""
        if self._producer is not None:
            self._producer.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._set_activity("shut down")

    async def _produce_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            async with self._changed:
                self._set_activity(f"waiting for a request ({len(self._ready)} batches ready)")
                await self._changed.wait_for(lambda: self._produced < self._prefetch_limit())
            self._set_activity(f"producing batch {self._produced}")
            try:
                produced = await loop.run_in_executor(self._executor, self._produce_one)
            except Exception as error:  # surfaces on the next next_batch call
                async with self._changed:
                    self._error = error
                    self._set_activity(f"failed producing batch {self._produced}: {error!r}")
                    self._changed.notify_all()
                return
            async with self._changed:
                if produced.complete is not None:
                    self._completions[produced.state[COMPLETION_KEY]] = produced.complete
                    while len(self._completions) > len(self._ready) + 1 + COMPLETABLE_HANDED_OUT_STATES:
                        self._completions.popitem(last=False)
                self._ready.append(produced)
                self._produced += 1
                self._changed.notify_all()
            self._metrics.record_produced(
                skipped_samples=produced.skipped_samples, filtered_samples=produced.filtered_samples, ready=len(self._ready)
            )

    def _prefetch_limit(self) -> int:
        """How many batches to have produced: the first alone, then up to ``prefetch_depth`` ahead.

        With a depth, the first batch is made as soon as the rank starts, and prefetching further
        starts with the second request: until then the other ranks on the node are still making
        their first batch (after a start or a restore), which the first step waits for, and
        prefetching would take their CPU (4 packed ranks on 2 cores: restore 1.0-1.2 -> 0.7-1.0 s).
        """
        if self._depth == 0:
            return self._requested
        return self._requested + self._depth if self._requested > 1 else 1

    def _produce_one(self) -> _Produced:
        if self._delay:
            time.sleep(self._delay)
        batch = self._next_from_loader()
        complete = None
        if self._deferred_states:
            state, complete = self._loader.state_dict_deferring()
            if complete is not None:
                state[COMPLETION_KEY] = f"{self._instance}:{self._produced}"
        else:
            state = self._loader.state_dict()
        return _Produced(
            batch,
            state,
            complete,
            self._task.batch_stats(batch),
            self._loader.skipped_samples,
            self._loader.filtered_samples,
        )

    def _next_from_loader(self) -> Any:
        fresh = self._iterator is None
        if fresh:
            self._iterator = iter(self._loader)
        try:
            return next(self._iterator)
        except StopIteration:
            pass
        if self._split_role == "train" and not fresh:
            # A training loader's `for` loop ends after virtual_epoch_length batches; the next
            # iteration continues the same (infinite) stream.
            self._iterator = iter(self._loader)
            try:
                return next(self._iterator)
            except StopIteration:
                pass
        raise DataExhaustedError(
            f"rank {self.rank} of {self.world_size}: the {self._split_role} loader has no batch "
            f"after {self._produced} batches"
        )

    def _set_activity(self, activity: str) -> None:
        self._activity, self._since = activity, time.monotonic()
