"""A loader in the calling process freezes what its first batch left behind, so Energon's
periodic collections stay cheap."""

from __future__ import annotations

import gc

from energon_fixtures import build_small_train_loader


def _tracked(value) -> bool:
    """Whether the collector walks ``value`` (frozen objects are not in ``gc.get_objects()``)."""
    return any(o is value for o in gc.get_objects())


def test_objects_the_first_batch_creates_are_frozen_the_second_batchs_are_not(energon_dataset, tokenizer):
    batches = iter(build_small_train_loader(energon_dataset, tokenizer, num_workers=0))
    try:
        first = next(batches)
        assert gc.is_tracked(first) and not _tracked(first)
        second = next(batches)
        assert _tracked(second)
    finally:
        gc.unfreeze()  # the loader never finishes here: leave the process as it was


def test_worker_processes_fork_from_a_frozen_heap_and_this_process_is_left_as_it_was(
    energon_dataset, tokenizer, monkeypatch
):
    gc.unfreeze()  # as a process that froze nothing
    real_freeze, real_unfreeze = gc.freeze, gc.unfreeze
    calls = []
    monkeypatch.setattr(gc, "freeze", lambda: (calls.append("freeze"), real_freeze())[1])
    monkeypatch.setattr(gc, "unfreeze", lambda: (calls.append("unfreeze"), real_unfreeze())[1])
    loader = build_small_train_loader(energon_dataset, tokenizer, num_workers=2)
    try:
        batches = iter(loader)
        next(batches)  # the workers fork here
        next(batches)
        assert calls == ["freeze", "unfreeze"]
        assert gc.get_freeze_count() == 0
    finally:
        loader.close()
