"""One endless, restorable batch stream per rank, in passes, over an Energon savable loader.

Energon's own epochs do not restore exactly with worker processes: torch restarts its worker
round-robin at worker 0 on every ``iter()`` while a restored loader has rotated its workers, and a
restored worker that finished its share before the save starts the next epoch at once. So the
Energon loader here never ends: it is iterated once, forever, and epochs are counted on top.

* :class:`PassEndDataset` (in each worker, exact mode) repeats the one-pass Energon pipeline
  forever and yields a :class:`PassEnd` marker after every pass, carrying the samples of the
  pass that no batch delivered and no error handler skipped (the last partial batch).
  A :class:`SourceGate` above each webdataset remembers, in the saved state, that the pass's
  source ran out: Energon's webdataset resets itself to "new pass" when it ends, so a state
  saved while the shuffle or packing buffers drain would otherwise refill them with the next
  pass's samples on restore.
* :class:`RankStream` (in the loader's process) takes the items of all workers in a fixed order
  that does not depend on torch's round-robin: round-robin over the workers whose current pass
  is not over yet; a pass ends when every worker sent its marker. Items of workers that are
  ahead wait in a small per-worker queue. The Energon state is saved at what was *delivered*
  (per-worker sample counters), plus the :class:`StreamPosition`.
  With workers it holds them back until its second item (:mod:`rl_data.energon.worker_hold`):
  after a start or restore only the worker owing the first item works.
"""

from __future__ import annotations

import gc
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from megatron.energon.flavors.base_dataset import SavableDataset
from megatron.energon.flavors.webdataset.sample_loader import WebdatasetSampleLoaderDataset
from megatron.energon.wrappers.base import BaseWrapperDataset

from rl_data.energon.compat import internals
from rl_data.energon.state_codec import EncodedValueCache
from rl_data.energon.worker_checkpoints import WorkerCheckpoints, ship_checkpoints
from rl_data.energon.worker_hold import WorkerHold, hold_back_workers


@dataclass(frozen=True, slots=True)
class PassEnd:
    """One worker's pass is over; ``dropped`` samples of it reached no batch and no skip."""

    dropped: int


class SourceGate(BaseWrapperDataset):
    """Yields its source once per pass: after the source ran out, nothing until :meth:`reopen`."""

    _savable_fields = ("_ended",)

    def __init__(self, dataset: SavableDataset, *, worker_config: Any) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self._ended = False

    def reopen(self) -> None:
        """Start the next pass."""
        self._ended = False

    def len_worker(self, worker_idx: int | None = None) -> int:
        return self.dataset.len_worker(worker_idx)

    def __iter__(self):
        if self._ended:
            return
        yield from self.dataset
        self._ended = True

    def config(self) -> dict[str, Any]:
        return {"type": type(self).__qualname__, "dataset": self.dataset.config()}

    def __str__(self) -> str:
        return f"SourceGate(dataset={self.dataset})"


def _gate_sources(dataset: SavableDataset) -> list[SourceGate]:
    """Put a :class:`SourceGate` right above every webdataset under ``dataset``."""
    gates = []
    if isinstance(dataset, BaseWrapperDataset):
        inner = list(dataset.datasets)
        for index, child in enumerate(inner):
            if isinstance(child, WebdatasetSampleLoaderDataset):
                inner[index] = SourceGate(child, worker_config=child.worker_config)
                gates.append(inner[index])
            else:
                gates.extend(_gate_sources(child))
        dataset.datasets = tuple(inner)
    return gates


class PassEndDataset(BaseWrapperDataset):
    """Repeat a finite (``repeat=False``) Energon pipeline forever, one :class:`PassEnd` per pass.

    Its state (sources delivered and samples skipped so far in this pass) is saved with the
    worker's other Energon state, so a worker that replays from a checkpoint counts the same.
    """

    _savable_fields = ("_pass_sources", "_pass_skipped")

    def __init__(
        self, dataset: SavableDataset, *, worker_config: Any, count_sources: Callable[[Any], int]
    ) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self._count_sources = count_sources
        self._gates = _gate_sources(dataset)
        if not self._gates:
            raise ValueError(f"no Energon webdataset found under {dataset}; cannot end a pass")
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self._pass_sources = 0
        self._pass_skipped = 0

    def len_worker(self, worker_idx: int | None = None) -> int:
        return self.dataset.len_worker(worker_idx)

    def _process_skipped(self) -> int:
        return getattr(self.worker_config, "process_skipped", 0)

    def __iter__(self):
        seen = self._process_skipped()
        while True:
            for batch in self.dataset:
                now = self._process_skipped()
                self._pass_skipped += now - seen
                seen = now
                self._pass_sources += self._count_sources(batch)
                yield batch
            now = self._process_skipped()
            self._pass_skipped += now - seen
            seen = now
            share = sum(gate.len_worker() for gate in self._gates)
            end = PassEnd(dropped=share - self._pass_sources - self._pass_skipped)
            self.reset_state_own()
            for gate in self._gates:
                gate.reopen()
            yield end

    def config(self) -> dict[str, Any]:
        return {"type": type(self).__qualname__, "dataset": self.dataset.config()}

    def __str__(self) -> str:
        return f"PassEndDataset(dataset={self.dataset})"


@dataclass(frozen=True, slots=True)
class PassOver:
    """A pass of the whole rank ended: its batches and the samples it dropped."""

    batches: int
    dropped: int


@dataclass(slots=True)
class StreamPosition:
    """Where a rank's stream stands, after what was delivered (plain JSON)."""

    #: The worker whose item comes next (workers whose pass is over are passed over).
    cursor: int = 0
    #: Workers whose current pass is over.
    finished: list[int] = field(default_factory=list)
    #: Passes completed.
    passes: int = 0
    #: Batches delivered in the current pass.
    pass_batches: int = 0
    #: Samples of the current pass dropped by the workers whose pass is over.
    pass_dropped: int = 0
    #: Batches delivered in the current ``for`` loop.
    loop_batches: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: Any, *, workers: int) -> "StreamPosition":
        fields = set(cls.__dataclass_fields__)
        if not isinstance(value, dict) or set(value) != fields:
            raise ValueError(
                f"loader state position must be a mapping with keys {sorted(fields)}, got "
                f"{value!r}; this state was not saved by this rl_data version"
            )
        position = cls(**{k: value[k] for k in fields})
        counts = (
            position.cursor,
            position.passes,
            position.pass_batches,
            position.pass_dropped,
            position.loop_batches,
        )
        valid = (
            all(isinstance(v, int) and v >= 0 for v in counts)
            and position.cursor < workers
            and isinstance(position.finished, list)
            and all(isinstance(w, int) and 0 <= w < workers for w in position.finished)
        )
        if not valid:
            raise ValueError(f"loader state position {value!r} is invalid for {workers} worker(s)")
        position.finished = list(position.finished)
        return position


class RankStream:
    """The rank's items in a fixed order, restorable at what was delivered (see module doc)."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self._workers = loader.num_workers
        self._lanes = max(1, self._workers)
        self._queues: list[deque[tuple[int, Any]]] = [deque() for _ in range(self._lanes)]
        self._delivered = [-1] * self._lanes
        self._iterator: Any = None
        self._pulled = 0
        self._froze = False  # without workers, the first item froze the heap (given back by close)
        self._resting_state: Any = None  # the Energon state until the first item is pulled
        self.position = StreamPosition()
        self._checkpoints: WorkerCheckpoints | None = None
        self._hold: WorkerHold | None = None
        if self._workers > 0:
            ship_checkpoints(loader)
            self._checkpoints = WorkerCheckpoints(loader)
            self._hold = hold_back_workers(loader)

    def restore(self, energon_state: Any, position: StreamPosition) -> None:
        """Restore before the first item (the caller checked the state)."""
        if self._iterator is not None:
            raise RuntimeError("cannot restore a stream that started")  # checked by the caller
        self._loader.restore_state_rank(energon_state)
        if self._workers > 0:
            self._delivered = internals.emitted_counters(self._loader)
            self._checkpoints.reset()
        self._resting_state = energon_state
        self.position = position

    def close(self) -> None:
        """Close the Energon iterator (without workers it is a plain generator).

        Without workers, give the collector back what the first item froze, and collect: Energon
        unfreezes only when its iteration ends, and closing the iterator does not end the inner
        generator that would (it waits in a reference cycle, frozen itself). Left frozen, or
        frozen again by the next loader's first item before a full collection, every loader
        closed in this process (a rank actor's rewinds) would keep its reference cycles for good.
        """
        if self._hold is not None:
            self._hold.close()
        if self._iterator is not None and hasattr(self._iterator, "close"):
            self._iterator.close()
        if self._froze:
            self._froze = False
            gc.unfreeze()
            if not sys.is_finalizing():
                gc.collect()

    def _first_item(self) -> Any:
        """The first item, pulled with the heap frozen.

        Energon starts an iteration with ``gc.collect()`` over every object alive: in this
        process without workers, in each worker with them (plus ``gc_init_worker``'s scan of
        ``gc.get_objects()``). In a rank actor (torch, transformers, Ray: ~270,000 objects) one
        such collection takes 0.1-0.25 s, paid on the first batch and again after every restore;
        with workers it was ~60 % of a worker's start. Frozen objects are skipped by both
        (CPython's advice before a fork: no copy-on-write of every object's GC header either).
        Young garbage is collected first; older garbage alive now stays until the unfreeze.

        With workers (they fork on the first ``next``) this process unfreezes afterwards,
        unless something else had frozen objects. Without workers it also freezes what the
        first batch left for good (lazy imports, tokenizer caches, ~27,000 objects that made
        each of Energon's every-10-batches collections 7-15 ms instead of ~0.3 ms); Energon's
        unfreeze at the end of its iteration releases every freeze.
        """
        already_frozen = gc.get_freeze_count() > 0
        gc.collect(1)
        gc.freeze()
        try:
            item = next(self._iterator)
        except BaseException:
            if not already_frozen:
                gc.unfreeze()
            raise
        if self._workers == 0:
            gc.freeze()
            self._froze = True
        elif not already_frozen:
            gc.unfreeze()
        return item

    def energon_state(self) -> Any:
        """The Energon rank state after the items delivered so far."""
        if self._pulled == 0:
            # Nothing pulled since construction or restore, and with workers a live save before
            # the first item can hang: the resting state is the same position.
            return self._resting_state
        if self._workers == 0:
            return self._loader.save_state_rank()
        return self._checkpoints.save_state_rank_at(self._delivered, next_worker=self.position.cursor)

    @property
    def encoded_worker_states(self) -> EncodedValueCache | None:
        """The JSON of the worker checkpoints :meth:`energon_state` may hold (None without workers)."""
        return None if self._checkpoints is None else self._checkpoints.encoded

    def next(self) -> Any:
        """The next batch, or a :class:`PassOver` when the pass of every worker ended."""
        position = self.position
        while True:
            worker = position.cursor
            while worker in position.finished:
                worker = (worker + 1) % self._lanes
            queue = self._queues[worker]
            while not queue:
                self._pull()
            sample_index, item = queue.popleft()
            self._delivered[worker] = sample_index
            if self._checkpoints is not None:
                self._checkpoints.delivered(worker, sample_index)
            position.cursor = (worker + 1) % self._lanes
            if not isinstance(item, PassEnd):
                position.pass_batches += 1
                return item
            position.pass_dropped += item.dropped
            position.finished.append(worker)
            if len(position.finished) == self._lanes:
                over = PassOver(batches=position.pass_batches, dropped=position.pass_dropped)
                position.finished.clear()
                position.passes += 1
                position.pass_batches = position.pass_dropped = 0
                return over

    def _pull(self) -> None:
        if self._iterator is None:
            self._iterator = iter(self._loader)
        if self._pulled == 1 and self._hold is not None:
            self._hold.release()  # the first item is out: the other workers start (worker_hold)
        try:
            item = self._first_item() if self._pulled == 0 else next(self._iterator)
        except StopIteration:
            raise RuntimeError(
                "the Energon training loader ended; rl_data builds it endless (repeat, or "
                "PassEndDataset), so its pipeline was changed"
            ) from None
        self._pulled += 1
        if self._workers == 0:
            self._queues[0].append((-1, item))
        else:
            worker, sample_index = internals.last_emitted(self._loader)
            self._queues[worker].append((sample_index, self._checkpoints.take(worker, item)))
