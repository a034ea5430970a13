"""A rank's Energon workers are held back until it wants its second batch (``worker_hold``).

The workers fork from this process, so a counter patched into rl_data's worker wrapper here
before the first ``iter()`` counts, inside each real worker, the items its Energon pipeline made.
"""

from __future__ import annotations

import multiprocessing
import time

import pytest
from torch.utils.data import get_worker_info

from energon_fixtures import batch_source_ids, build_small_train_loader
from restore_check import stream, torch_roundtrip
from rl_data.energon.compat import SavableDatasetWrapper


def _count_items_per_worker(monkeypatch, workers: int):
    """Shared counters of the items each torch worker's pipeline made (patched before the fork)."""
    counts = multiprocessing.get_context("fork").Array("i", workers)
    inner = SavableDatasetWrapper.items_with_checkpoints

    def counting(self):
        worker = get_worker_info().id
        for item in inner(self):
            counts[worker] += 1
            yield item

    monkeypatch.setattr(SavableDatasetWrapper, "items_with_checkpoints", counting)
    return counts


def _settled(counts, done, timeout_s=30.0):
    """``counts`` 0.5 s after ``done(counts)`` held (or after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while not done(list(counts)) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # nothing more may come
    return list(counts)


def _first_made(counts):
    return counts[0] >= 1


@pytest.mark.timeout(180)
@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")  # 4 workers on 2 cores
@pytest.mark.parametrize("restored_after", [0, 3], ids=["fresh", "restored_after_3_batches"])
@pytest.mark.parametrize("packing", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("workers,prefetch_factor", [(2, 2), (2, 1), (4, 2)], ids=["2w_pf2", "2w_pf1", "4w_pf2"])
def test_only_the_worker_owing_the_first_batch_works_until_the_second_is_wanted(
    energon_dataset, tokenizer, packing, restored_after, workers, prefetch_factor, monkeypatch
):
    def build():
        return build_small_train_loader(
            energon_dataset, tokenizer, num_workers=workers, packing=packing, prefetch_factor=prefetch_factor
        )

    loader = build()
    reference = stream(loader, batch_source_ids, restored_after + 4)
    state = None
    if restored_after:
        loader.close()
        loader = build()
        stream(loader, batch_source_ids, restored_after)
        state = torch_roundtrip(loader.state_dict())  # after 3 batches another worker owes the next
    loader.close()

    counts = _count_items_per_worker(monkeypatch, workers)
    loader = build()
    if state is not None:
        loader.load_state_dict(state)
    try:
        batches = iter(loader)
        first = next(batches)
        # torch queued prefetch_factor batches on each worker; only torch's worker 0 made one
        assert _settled(counts, _first_made) == [1] + [0] * (workers - 1)
        second = next(batches)  # releases the hold
        # torch asked for prefetch_factor per worker, then one more per batch taken (workers 0, 1)
        wanted = [prefetch_factor + (worker < 2) for worker in range(workers)]
        assert _settled(counts, lambda made: made == wanted) == wanted
        rest = [next(batches) for _ in range(2)]
    finally:
        loader.close()
    found = [batch_source_ids(batch)[0] for batch in (first, second, *rest)]
    assert found == [list(step.ids) for step in reference[restored_after:]]


@pytest.mark.timeout(120)
def test_closing_a_held_loader_stops_its_workers_without_making_batches(energon_dataset, tokenizer, monkeypatch):
    counts = _count_items_per_worker(monkeypatch, 2)
    loader = build_small_train_loader(energon_dataset, tokenizer, num_workers=2)
    next(iter(loader))
    workers = list(loader._loader._iterator._workers)
    assert _settled(counts, _first_made) == [1, 0]
    started = time.monotonic()
    loader.close()
    assert not any(worker.is_alive() for worker in workers)
    assert time.monotonic() - started < 3.0  # torch waits 5 s for a worker that does not stop
    assert list(counts) == [1, 0]
