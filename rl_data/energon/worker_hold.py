"""Hold back a rank's Energon workers until the rank wants more than its first batch.

torch's DataLoader starts every worker at once and queues ``prefetch_factor`` batches on each.
After a restore each worker first rebuilds its pipeline (re-reads the samples its shuffle buffer
held from the tar, restores its packing buffers), then makes those batches: with 4 ranks of 2
workers on 2 cores, 8 restores and 16 batches share the CPU while the first step needs 4
batches. Under a :class:`WorkerHold` only torch's worker 0 works at first (after a restore it is
the logical worker that owes the rank's next batch, see ``WorkerConfig.worker_id_offset``), and
only until it has made one batch. The other workers start, and worker 0 goes on, when the
loader's process releases the hold: :class:`rl_data.energon.epoch_stream.RankStream` does so
before it pulls its second item, so nothing can wait on a held worker. Only the timing changes:
the items and their order are torch's.

Held workers have not entered Energon's ``SavableDatasetWrapper.__iter__`` (its command thread
does not run yet): a loader under a hold must not send worker commands before the release
(``RankStream`` answers states from shipped checkpoints, :mod:`rl_data.energon.worker_checkpoints`).
The hold is the outermost part of the workers' iteration
(:class:`rl_data.energon.compat.SavableDatasetWrapper` calls :meth:`WorkerHold.iterate`).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import get_worker_info

from rl_data.energon.compat import SavableDatasetWrapper, SavableLoader

#: How often a held worker checks that the loader's process is still alive.
_PARENT_CHECK_S = 1.0


class WorkerHold:
    """Shared by a loader's process and its forked workers (made before they fork)."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("fork")  # Energon forks its workers
        self._released = context.Event()
        self._closing = context.Event()

    @property
    def released(self) -> bool:
        return self._released.is_set()

    def release(self) -> None:
        """Let every worker go on."""
        self._released.set()

    def close(self) -> None:
        """Release the workers so that they stop at once (the loader is shutting down)."""
        self._closing.set()
        self._released.set()

    def wait(self, parent_pid: int) -> bool:
        """In a worker: block until released; False when the workers should stop instead
        (closing, or the loader's process ``parent_pid`` died)."""
        while not self._released.wait(timeout=_PARENT_CHECK_S):
            if os.getppid() != parent_pid:
                return False
        return not self._closing.is_set()

    def iterate(self, start: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        """In a worker: the items of ``start()`` (the worker's Energon iteration), started and
        continued where the module doc says."""
        worker = get_worker_info()
        if worker is None or self.released:
            yield from start()
            return
        parent_pid, first = os.getppid(), worker.id == 0
        try:
            if not first and not self.wait(parent_pid):
                return
            for item in start():
                yield item
                if first:  # resumed: torch asks worker 0 for its second batch
                    first = False
                    if not self.wait(parent_pid):
                        return
        finally:
            if worker.id == 0:
                self.release()  # worker 0 ended or failed: the loader's process goes on to the others


def hold_back_workers(loader: SavableLoader) -> WorkerHold:
    """Put ``loader``'s workers under a new hold (before they start, i.e. before the first ``iter()``)."""
    if not isinstance(loader.dataset, SavableDatasetWrapper):
        raise TypeError(
            f"hold_back_workers found a loader whose workers run {type(loader.dataset).__qualname__}, "
            "expected a rl_data.energon.compat.SavableLoader with worker processes; build it so "
            "(num_workers > 0)"
        )
    hold = WorkerHold()
    loader.dataset.hold = hold
    return hold
