"""The worker-checkpoint race fix: a worker that has not started reports its pending restore."""

from __future__ import annotations

import time

from megatron.energon.savable_loader import (
    SavableCheckpoint,
    SavableDatasetCheckpoint,
    SavableDatasetWrapper,
)

from rl_data.energon import energon_fixes


def _wrapper(worker_id, checkpoints, restore_from, skip):
    wrapper = object.__new__(SavableDatasetWrapper)
    wrapper._worker_id = worker_id
    wrapper._last_checkpoints = checkpoints
    wrapper._workers_restore_from = restore_from
    wrapper._workers_skip_samples = skip
    return wrapper


def _placeholder():
    return [SavableCheckpoint(state=None, checkpoint_time=time.perf_counter(), sample_index=-1)]


def test_fix_is_installed():
    assert SavableDatasetWrapper.get_checkpoint is energon_fixes.get_checkpoint


def test_fresh_worker_that_has_not_started_skips_nothing():
    wrapper = _wrapper(1, _placeholder(), [None, None], [0, 0])
    # Unpatched Energon answers offset 1 here (0 - (-1)): the restored loader loses a sample.
    assert energon_fixes._original_get_checkpoint(wrapper, [0, -1]).offset == 1
    assert wrapper.get_checkpoint([0, -1]) == SavableDatasetCheckpoint(state=None, offset=0)


def test_restored_worker_that_has_not_started_keeps_its_pending_restore():
    pending = object()
    wrapper = _wrapper(0, _placeholder(), [pending, None], [3, 0])
    checkpoint = wrapper.get_checkpoint([4, -1])
    assert checkpoint.state is pending and checkpoint.offset == 3


def test_started_worker_uses_energons_own_lookup():
    state = object()
    checkpoints = _placeholder() + [
        SavableCheckpoint(state=state, checkpoint_time=time.perf_counter(), sample_index=0)
    ]
    wrapper = _wrapper(0, checkpoints, [None], [0])
    checkpoint = wrapper.get_checkpoint([2])
    assert checkpoint.state is state and checkpoint.offset == 3
