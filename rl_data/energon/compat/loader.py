"""rl_data's Energon loader: Energon 7.4's ``SavableDataLoader`` with three fixes and rl_data's
worker additions, scoped to the loaders rl_data builds (no Energon class or module is changed).

``SavableDataLoader.__init__`` builds its worker wrapper and its watchdog itself and takes no
class for them, so :class:`SavableLoader` gives the two instances it just built rl_data's
subclasses below (their fields stay as Energon set them). The subclasses keep Energon's class
names: Energon writes ``type(x).__name__`` into restore keys and saved states, which therefore do
not change. Energon's worker processes fork from the loader's process and inherit them.

Fixes:

1. A worker that has not started iterating yet (forked, but its first ``__iter__`` has not taken
   the command lock) holds only the placeholder checkpoint ``(state=None, sample_index=-1)``, so
   Energon's ``get_checkpoint`` answers "initial state, skip 1 sample" instead of "skip 0" (or,
   right after a restore, drops the restored position). Its exact position is the restore it has
   not applied yet: :meth:`SavableDatasetWrapper.get_checkpoint` returns that.
2. ``restore_state_rank`` sets each worker's "last emitted sample" to the checkpoint's sample
   index minus one and forgets the checkpoint's ``offset`` (samples the worker skips on restore).
   A state saved after a restore, before every worker emitted again, then makes those workers
   replay the skipped samples: duplicates after a chain of restores.
   :meth:`SavableLoader.restore_state_rank` counts the offset.
3. ``WatchdogDataset.__iter__`` starts a ``Watchdog`` thread per iteration and never finishes it:
   the thread polls every second for the life of the process, one more per pass, restore and
   loader. :meth:`WatchdogDataset.__iter__` finishes its watchdog when it ends or is closed.
4. Energon's tar readers keep up to ``parallel_shard_iters`` shards open and read each sample with
   ``TarFile.next()``, which appends a ``TarInfo`` to the open file's ``members`` for every tar
   member it reads and never drops them: a shard that stays open grows by every sample read from
   it, every epoch (~0.5 KB a sample; without bound over a small dataset read for many epochs).
   :meth:`WatchdogDataset.__iter__`, which runs where the samples are read (each worker process,
   or the loader's process without workers), empties those lists after every item it yields;
   Energon looks members up by the ``TarInfo`` it just read, never in that list.

Worker additions, in one :meth:`SavableDatasetWrapper.__iter__`: the hold of
:mod:`rl_data.energon.worker_hold` around Energon's iteration, and inside it the checkpoints sent
with the items (:mod:`rl_data.energon.worker_checkpoints`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from megatron.energon.savable_loader import SavableDataLoader, SavableDataLoaderState, SavableDatasetCheckpoint
from megatron.energon.savable_loader import SavableDatasetWrapper as EnergonSavableDatasetWrapper
from megatron.energon.watchdog import Watchdog
from megatron.energon.wrappers.base import BaseWrapperDataset
from megatron.energon.wrappers.watchdog_dataset import WatchdogDataset as EnergonWatchdogDataset

from rl_data.energon.compat import internals
from rl_data.energon.compat.installation import installed


class SavableDatasetWrapper(EnergonSavableDatasetWrapper):
    """Energon's worker wrapper with fix 1 and rl_data's worker additions (module doc)."""

    #: The hold of this loader's workers (:func:`rl_data.energon.worker_hold.hold_back_workers`):
    #: ``hold.iterate(start)`` yields ``start()``'s items when the hold allows; None: not held.
    hold: Any = None
    #: ``envelope(item, checkpoint)`` is what a worker sends instead of ``item``, ``checkpoint``
    #: being ``(sample_index, state)`` of the worker checkpoint stored before the item, or None when
    #: it was sent before (:func:`rl_data.energon.worker_checkpoints.ship_checkpoints`); None: the
    #: items as Energon yields them.
    envelope: Callable[[Any, tuple[int, Any] | None], Any] | None = None

    def __iter__(self) -> Iterator[tuple[int, int, Any]]:
        """Energon's worker iteration under the hold (outermost), sending checkpoints (inside it)."""
        if self.hold is None:
            return self.items_with_checkpoints()
        return self.hold.iterate(self.items_with_checkpoints)

    def items_with_checkpoints(self) -> Iterator[tuple[int, int, Any]]:
        """Energon's worker iteration, each item wrapped in :attr:`envelope` (when set)."""
        items = super().__iter__()
        if self.envelope is None:
            yield from items
            return
        sent = None
        for worker_id, sample_index, item in items:
            # runs while Energon's generator is suspended at its yield, after it stored a checkpoint
            newest = internals.stored_checkpoints(self)[-1]
            checkpoint = None
            if newest.sample_index != sent:
                sent = newest.sample_index
                checkpoint = (newest.sample_index, newest.state)
            yield worker_id, sample_index, self.envelope(item, checkpoint)

    def get_checkpoint(self, last_sample_indexes: list[int]) -> SavableDatasetCheckpoint:
        """Energon's ``get_checkpoint``, exact for a worker that has not started yet (fix 1)."""
        stored = internals.stored_checkpoints(self)
        if len(stored) == 1 and stored[0].state is None and stored[0].sample_index == -1:
            return internals.pending_restore(self)
        return super().get_checkpoint(last_sample_indexes)


class WatchdogDataset(EnergonWatchdogDataset):
    """Energon's watchdog, whose thread ends with the iteration (fix 3), and the outermost dataset
    of the reading process, where the open tar files forget their members (fix 4)."""

    def __iter__(self) -> Iterator[Any]:
        readers = internals.tar_readers(self.dataset)
        with contextlib.closing(self._watched()) as items:
            for item in items:
                internals.forget_tar_members(readers)
                yield item

    def _watched(self) -> Iterator[Any]:
        """Energon's iteration under a watchdog that ends with it."""
        if self.timeout_seconds is None:
            yield from self.dataset
            return
        watchdog = Watchdog(
            timeout=self.timeout_seconds,
            initial_timeout=self.initial_timeout_seconds,
            callback=internals.watchdog_trigger(self),
            enabled=False,
        )
        try:
            yield from watchdog.watch_iter(self.dataset)
        finally:
            watchdog.finish()


class SavableLoader(SavableDataLoader):
    """Energon's ``SavableDataLoader`` with the fixes of the module doc; built with the arguments of
    ``get_savable_loader`` (after :func:`~rl_data.energon.compat.installation.install`)."""

    def __init__(self, dataset: Any, **options: Any) -> None:
        if not installed():
            raise RuntimeError(
                "rl_data.energon.compat.install() was not called in this process, expected it before "
                "a SavableLoader is built (it checks the Megatron-Energon version); call it first"
            )
        super().__init__(dataset, **options)
        if self.num_workers > 0:
            _adopt(self.dataset, SavableDatasetWrapper)
        _adopt(watchdog_of(self.dataset), WatchdogDataset)

    def restore_state_rank(self, state: SavableDataLoaderState | None) -> None:
        """Energon's ``restore_state_rank``, whose per-worker counters include the offset (fix 2)."""
        super().restore_state_rank(state)
        if state is not None and self.num_workers > 0:
            internals.set_emitted_counters(
                self, [_restored_index(checkpoint) + checkpoint.offset - 1 for checkpoint in state.worker_states]
            )

    def close(self) -> None:
        """Close the iteration and stop the worker processes now (see ``internals.shut_down``)."""
        internals.shut_down(self)


def _restored_index(checkpoint: SavableDatasetCheckpoint) -> int:
    """The worker's sample index right after restoring ``checkpoint`` (before skipping)."""
    return 0 if checkpoint.state is None else checkpoint.state.sample_index


def watchdog_of(wrapper: Any) -> EnergonWatchdogDataset:
    """The watchdog ``SavableDataLoader.__init__`` put under its worker wrapper (and its GC dataset)."""
    dataset = wrapper.dataset
    while not isinstance(dataset, EnergonWatchdogDataset):
        if not isinstance(dataset, BaseWrapperDataset):
            raise TypeError(
                f"found {type(dataset).__qualname__} under the loader's worker wrapper and no watchdog "
                "above it, expected the WatchdogDataset SavableDataLoader.__init__ builds; re-check "
                "rl_data.energon.compat against this Energon version"
            )
        dataset = dataset.dataset
    return dataset


def _adopt(instance: Any, subclass: type) -> None:
    """Make ``instance``, as Energon built it, an instance of rl_data's ``subclass`` of its class."""
    energon_class = subclass.__bases__[0]
    if type(instance) is not energon_class:
        raise TypeError(
            f"expected Energon's loader to build a {energon_class.__module__}.{energon_class.__qualname__}, "
            f"found {type(instance).__module__}.{type(instance).__qualname__}; re-check "
            "rl_data.energon.compat against this Energon version"
        )
    instance.__class__ = subclass
