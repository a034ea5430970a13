"""Energon worker-checkpoint fixes: a worker that has not started reports its pending restore;
restored per-worker counters include the skip offset (end to end in
``test_sft_dataloader_workers.py::test_a_chain_of_restores_with_workers_is_exact``); an
iteration's watchdog thread ends with it; the fixes refuse an Energon version they were not
checked against."""

from __future__ import annotations

import threading
import time

import pytest
from energon_fixtures import build_small_train_loader
from megatron.energon.savable_loader import (
    SavableCheckpoint,
    SavableDataLoader,
    SavableDatasetCheckpoint,
    SavableDatasetWrapper,
)
from megatron.energon.watchdog import Watchdog
from megatron.energon.wrappers.watchdog_dataset import WatchdogDataset

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


def test_fixes_are_installed():
    assert SavableDatasetWrapper.get_checkpoint is energon_fixes.get_checkpoint
    assert SavableDataLoader.restore_state_rank is energon_fixes.restore_state_rank
    assert WatchdogDataset.__iter__ is energon_fixes.watched_iteration


def test_an_unchecked_energon_version_is_refused():
    with pytest.raises(RuntimeError) as error:
        energon_fixes.apply("7.5.0")
    assert str(error.value).startswith(
        "rl_data.energon.energon_fixes patches Megatron-Energon internals checked against "
        "versions 7.4.0, 7.4.1, found '7.5.0'; re-check the three fixes"
    )


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


def _watchdog_threads() -> list[threading.Thread]:
    return [
        thread for thread in threading.enumerate()
        if isinstance(getattr(getattr(thread, "_target", None), "__self__", None), Watchdog)
    ]  # fmt: skip


def test_an_ended_or_closed_iteration_leaves_no_watchdog_thread(energon_dataset, tokenizer):
    assert WatchdogDataset.__iter__ is energon_fixes.watched_iteration
    before = len(_watchdog_threads())
    loader = build_small_train_loader(energon_dataset, tokenizer, num_workers=0, loop_length=3)
    assert len(list(loader)) == 3
    assert len(_watchdog_threads()) == before + 1  # the iteration goes on past the loop
    loader.close()
    assert len(_watchdog_threads()) == before
