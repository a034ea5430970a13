"""A loader starts from a frozen heap (Energon's first full collection skips what was alive
before it) and freezes what its first batch left behind, so Energon's periodic collections stay
cheap."""

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


def test_energons_first_full_collection_skips_the_objects_alive_before_the_first_batch(
    energon_dataset, tokenizer, monkeypatch
):
    gc.unfreeze()  # as a process that froze nothing
    alive_before = [[]]  # a container the collector walks while it is not frozen
    walked_at_full_collections = []
    real_collect = gc.collect

    def collect(generation: int = 2) -> int:
        if generation == 2:
            walked_at_full_collections.append(_tracked(alive_before))
        return real_collect(generation)

    monkeypatch.setattr(gc, "collect", collect)
    batches = iter(build_small_train_loader(energon_dataset, tokenizer, num_workers=0))
    try:
        next(batches)
        assert walked_at_full_collections == [False]  # Energon's collection at the start of its iteration
    finally:
        gc.unfreeze()


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
