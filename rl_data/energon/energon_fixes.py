"""A fix for a race in Megatron-Energon 7.4's worker checkpoints, applied on import.

With ``num_workers > 0``, ``SavableLoader.save_state_rank()`` asks every worker for the
checkpoint matching the last sample it emitted. A worker that has not started iterating yet
(it was forked but its first ``__iter__`` has not taken the command lock) still holds only
the placeholder checkpoint ``(state=None, sample_index=-1)``, so it answers "initial state,
skip 1 sample" instead of "initial state, skip 0" — or, right after a restore, it drops the
restored position altogether. The restored loader then silently skips a batch. Seen here
under load as a flaky restore-after-1-batch with 2 workers.

A worker in that situation has emitted nothing since it was built or restored, so its exact
position is the restore it has not applied yet: that is what the patched method returns.
"""

from __future__ import annotations

from megatron.energon.savable_loader import SavableDatasetCheckpoint, SavableDatasetWrapper

_original_get_checkpoint = SavableDatasetWrapper.get_checkpoint


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


def apply() -> None:
    """Install the fix (idempotent)."""
    SavableDatasetWrapper.get_checkpoint = get_checkpoint


apply()
