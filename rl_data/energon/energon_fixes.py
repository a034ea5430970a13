"""Fixes for Megatron-Energon 7.4's worker checkpoints, applied on import, and the two pieces of
Energon's main-process bookkeeping that :mod:`rl_data.energon.epoch_stream` reads.

Everything here touches private attributes of ``SavableDataLoader`` / ``SavableDatasetWrapper``
as they are in the versions of :data:`PATCHED_VERSIONS`; importing with another Energon raises,
so an upgrade is checked against this module instead of silently losing samples.

1. A worker that has not started iterating yet (forked, but its first ``__iter__`` has not
   taken the command lock) holds only the placeholder checkpoint ``(state=None,
   sample_index=-1)``, so ``get_checkpoint`` answers "initial state, skip 1 sample" instead of
   "skip 0" (or, right after a restore, drops the restored position). Its exact position is the
   restore it has not applied yet: the patched ``get_checkpoint`` returns that.
2. ``restore_state_rank`` sets each worker's "last emitted sample" to the checkpoint's sample
   index minus one and forgets the checkpoint's ``offset`` (samples the worker skips on
   restore). A state saved after a restore, before every worker emitted again, then makes those
   workers replay the skipped samples: duplicates after a chain of restores. The patched method
   counts the offset.
3. ``WatchdogDataset.__iter__`` starts a ``Watchdog`` thread per iteration and never finishes
   it: the thread polls every second for the life of the process, one more per pass, restore
   and loader (a test session had 100+). The patched iteration finishes its watchdog when it
   ends or is closed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import megatron.energon
from megatron.energon.savable_loader import (
    SavableDataLoader,
    SavableDataLoaderState,
    SavableDatasetCheckpoint,
    SavableDatasetWrapper,
)
from megatron.energon.watchdog import Watchdog
from megatron.energon.wrappers.watchdog_dataset import WatchdogDataset

#: Energon versions whose internals this module was checked against.
PATCHED_VERSIONS = ("7.4.0", "7.4.1")

_original_get_checkpoint = SavableDatasetWrapper.get_checkpoint
_original_restore_state_rank = SavableDataLoader.restore_state_rank


def _check_version(version: str) -> None:
    if version not in PATCHED_VERSIONS:
        raise RuntimeError(
            f"rl_data.energon.energon_fixes patches Megatron-Energon internals checked against "
            f"versions {', '.join(PATCHED_VERSIONS)}, found {version!r}; re-check the three fixes "
            "and rl_data.energon.epoch_stream against this version (tests/test_energon_fixes.py, "
            "tests/test_sft_dataloader_workers.py), then add it to PATCHED_VERSIONS"
        )


def _has_not_started(wrapper: SavableDatasetWrapper) -> bool:
    checkpoints = wrapper._last_checkpoints
    return len(checkpoints) == 1 and checkpoints[0].state is None and checkpoints[0].sample_index == -1


def get_checkpoint(self: SavableDatasetWrapper, last_sample_indexes: list[int]) -> SavableDatasetCheckpoint:
    """``SavableDatasetWrapper.get_checkpoint`` that is exact for a worker not started yet."""
    if _has_not_started(self):
        return SavableDatasetCheckpoint(
            state=self._workers_restore_from[self._worker_id],
            offset=self._workers_skip_samples[self._worker_id],
        )
    return _original_get_checkpoint(self, last_sample_indexes)


def restore_state_rank(self: SavableDataLoader, state: SavableDataLoaderState | None) -> None:
    """``SavableDataLoader.restore_state_rank`` whose per-worker counters include the offset."""
    _original_restore_state_rank(self, state)
    if state is not None and self.num_workers > 0:
        self._worker_sample_counters = [
            _restored_index(checkpoint) + checkpoint.offset - 1 for checkpoint in state.worker_states
        ]


def watched_iteration(self: WatchdogDataset) -> Iterator[Any]:
    """``WatchdogDataset.__iter__`` whose watchdog thread ends with the iteration."""
    if self.timeout_seconds is None:
        yield from self.dataset
        return
    watchdog = Watchdog(
        timeout=self.timeout_seconds,
        initial_timeout=self.initial_timeout_seconds,
        callback=self._watchdog_trigger,
        enabled=False,
    )
    try:
        yield from watchdog.watch_iter(self.dataset)
    finally:
        watchdog.finish()


def _restored_index(checkpoint: SavableDatasetCheckpoint) -> int:
    """The worker's sample index right after restoring ``checkpoint`` (before skipping)."""
    return 0 if checkpoint.state is None else checkpoint.state.sample_index


def last_emitted(loader: SavableDataLoader) -> tuple[int, int]:
    """``(worker, sample index)`` of the item the loader's iterator returned last (workers > 0)."""
    worker = (loader._next_worker_id - 1) % loader.num_workers
    return worker, loader._worker_sample_counters[worker]


def emitted_counters(loader: SavableDataLoader) -> list[int]:
    """Per worker, the sample index of the last item the loader holds as emitted."""
    return list(loader._worker_sample_counters)


def apply(version: str = megatron.energon.__version__) -> None:
    """Install the fixes (idempotent); raises for an Energon version they were not checked on."""
    _check_version(version)
    SavableDatasetWrapper.get_checkpoint = get_checkpoint
    SavableDataLoader.restore_state_rank = restore_state_rank
    WatchdogDataset.__iter__ = watched_iteration


apply()
