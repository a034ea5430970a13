"""The only rl_data module that reads or writes Megatron-Energon's private fields.

Each function names the Energon internal it touches, as it is in the versions of
:data:`~rl_data.energon.compat.installation.SUPPORTED_ENERGON`, and why rl_data needs it; an
Energon upgrade is re-checked here. ``tests/test_energon_compat.py`` fails when another module
of rl_data touches one of these fields.
"""

from __future__ import annotations

from typing import Any

from megatron.energon.flavors.webdataset.sample_loader import WebdatasetSampleLoaderDataset
from megatron.energon.savable_loader import (
    SavableCheckpoint,
    SavableDataLoader,
    SavableDatasetCheckpoint,
    SavableDatasetWrapper,
)
from megatron.energon.wrappers.base import BaseWrapperDataset


def last_emitted(loader: SavableDataLoader) -> tuple[int, int]:
    """``(worker, sample index)`` of the item ``loader``'s iterator returned last (workers > 0).

    Reads ``SavableDataLoader._next_worker_id`` and ``_worker_sample_counters``, which Energon sets
    for every item it yields: the rank stream files each item under the worker that made it
    (:class:`rl_data.energon.epoch_stream.RankStream`).
    """
    worker = (loader._next_worker_id - 1) % loader.num_workers
    return worker, loader._worker_sample_counters[worker]


def emitted_counters(loader: SavableDataLoader) -> list[int]:
    """Per worker, the sample index of the last item ``loader`` holds as emitted.

    Reads ``SavableDataLoader._worker_sample_counters``: right after a restore, the position each
    worker's stream was delivered to.
    """
    return list(loader._worker_sample_counters)


def set_emitted_counters(loader: SavableDataLoader, counters: list[int]) -> None:
    """Write ``SavableDataLoader._worker_sample_counters``, which ``save_state_rank`` asks the
    workers' checkpoints for (the restore fix of :class:`~rl_data.energon.compat.loader.SavableLoader`)."""
    loader._worker_sample_counters = list(counters)


def pending_restores(loader: SavableDataLoader) -> list[Any]:
    """Per worker, the ``SavableDatasetState`` it restores when it starts (None: the initial state).

    Reads ``SavableDatasetWrapper._workers_restore_from``, set by ``restore_state_rank``: where the
    loader process's copy of the worker checkpoints starts (:mod:`rl_data.energon.worker_checkpoints`).
    """
    return list(loader.dataset._workers_restore_from)


def micro_batch_size(loader: SavableDataLoader) -> int | None:
    """Calls ``SavableDataLoader._get_batch_size()``: the ``micro_batch_size`` a rank state holds,
    which Energon compares on restore (rank states made without asking the workers need it)."""
    return loader._get_batch_size()


def stored_checkpoints(wrapper: SavableDatasetWrapper) -> list[SavableCheckpoint]:
    """The checkpoints a worker stored, oldest first (in that worker's process).

    Reads ``SavableDatasetWrapper._last_checkpoints``: Energon stores one before an item is
    yielded, which rl_data sends along with the item, and before the worker starts only a
    placeholder (state None, sample index -1).
    """
    return wrapper._last_checkpoints


def pending_restore(wrapper: SavableDatasetWrapper) -> SavableDatasetCheckpoint:
    """The checkpoint this worker restores when it starts: where a worker that has not started is.

    Reads ``SavableDatasetWrapper._worker_id``, ``_workers_restore_from`` and
    ``_workers_skip_samples`` (the state it restores and the samples it skips from there).
    """
    worker = wrapper._worker_id
    return SavableDatasetCheckpoint(
        state=wrapper._workers_restore_from[worker], offset=wrapper._workers_skip_samples[worker]
    )


def watchdog_trigger(dataset: Any) -> Any:
    """``WatchdogDataset._watchdog_trigger``: the callback Energon's own watchdog iteration gives
    its ``Watchdog`` (warn or fail on a slow sample), for rl_data's iteration that also ends it."""
    return dataset._watchdog_trigger


def find_wrapped(dataset: Any, cls: type) -> Any:
    """The outermost dataset of type ``cls`` under ``dataset`` (None if there is none).

    Calls ``BaseWrapperDataset._find_wrapped_dataset``: Energon's batching hides the packing
    dataset the packing restore cache must read from (:mod:`rl_data.energon.packing_restore`).
    """
    return dataset._find_wrapped_dataset(cls)


def packing_buffers(packing: Any) -> tuple[Any, Any]:
    """The reading buffer and the pre-packing buffer of a ``PackingDataset``.

    Reads ``PackingDataset._reading_buffer`` and ``_pre_packing_buffer``: the samples they hold are
    what a state saves encoded (:mod:`rl_data.energon.packing_restore`).
    """
    return packing._reading_buffer, packing._pre_packing_buffer


def shut_down(loader: SavableDataLoader) -> None:
    """Close ``loader``'s iteration and stop its worker processes now.

    Energon keeps its one iteration over the workers in ``SavableDataLoader._epoch_iterator`` (closing
    it runs its clean-up); torch keeps its worker iterator in ``DataLoader._iterator`` and stops
    persistent workers in ``_shutdown_workers`` (otherwise only when the loader is garbage
    collected, waiting 5 s per worker).
    """
    if loader._epoch_iterator is not None:
        loader._epoch_iterator.close()
        loader._epoch_iterator = None
    worker_iterator = loader._iterator
    if worker_iterator is not None and hasattr(worker_iterator, "_shutdown_workers"):
        worker_iterator._shutdown_workers()
        loader._iterator = None


def tar_readers(dataset: Any) -> list[Any]:
    """Every tar reader under ``dataset`` (the ``ITarReader`` of each webdataset it reads: several
    for a blend or a join).

    Walks ``BaseWrapperDataset.datasets`` down to each ``WebdatasetSampleLoaderDataset`` and reads
    its ``join_readers``: the readers whose open tar files keep a ``TarInfo`` per member read
    (fix 4 of :mod:`rl_data.energon.compat.loader`).
    """
    readers, pending = [], [dataset]
    while pending:
        node = pending.pop()
        if isinstance(node, WebdatasetSampleLoaderDataset):
            readers += node.join_readers
        elif isinstance(node, BaseWrapperDataset):
            pending += node.datasets
    return readers


def forget_tar_members(readers: list[Any]) -> None:
    """Empty the ``members`` list of every tar file ``readers`` hold open.

    Reads ``ITarReader.itar_files_cache`` (the shards a reader keeps open, up to its
    ``itar_cache_size``) and clears ``tarfile.TarFile.members``, to which ``TarFile.next()`` appends
    every member it reads: Energon reads a sample member by member with ``next()`` and opens each by
    the ``TarInfo`` it got (``extractfile(tarinfo)``), never looking one up in that list.
    """
    for reader in readers:
        for tar_file in reader.itar_files_cache.values():
            if tar_file.members:
                tar_file.members.clear()
