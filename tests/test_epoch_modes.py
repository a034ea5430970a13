"""Epoch modes of the training loader on a small real split.

``exact`` (default): every pass over the rank's share yields every sample once (the last
partial batch of each worker's pass is dropped and counted), each pass in a new deterministic
order, and a restore at any step, across pass boundaries, continues exactly. ``virtual``:
Energon's endless repetition, whose shuffle buffer mixes consecutive passes.
"""

from __future__ import annotations

from collections import Counter

import pytest

from energon_fixtures import batch_source_ids, build_small_train_loader, write_chat_dataset
from restore_check import assert_restores_at_every_step, stream, torch_roundtrip
from rl_data.energon.sft_dataloader import EnergonSFTDataLoader

PASSES = 3


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory, chat_conversations):
    """13 short conversations, 1 or 2 per shard, all in the train split."""
    return write_chat_dataset(
        tmp_path_factory.mktemp("epoch_modes"),
        chat_conversations[:13],
        samples_per_shard=2,
        splits={"train": 1.0},
        max_messages=2,
    )


def _passes(loader, count):
    """The sample ids of ``count`` ``for`` loops (one pass each in exact mode)."""
    return [[i for batch in loader for i in batch_source_ids(batch)[0]] for _ in range(count)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("packing", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("num_workers", [0, 2], ids=["0_workers", "2_workers"])
def test_every_pass_yields_each_sample_once_in_a_new_order(
    tiny_dataset, tokenizer, num_workers, packing
):
    keys = set(tiny_dataset.split_keys["train"])
    runs, dropped = [], []
    for _ in range(2):
        loader = build_small_train_loader(
            tiny_dataset, tokenizer, num_workers=num_workers, packing=packing
        )
        runs.append(_passes(loader, PASSES))
        dropped.append(loader.dropped_samples)
        assert loader.completed_passes == PASSES
        loader.close()
    passes = runs[0]
    assert runs[1] == passes  # same seed, same passes
    for ids in passes:
        assert len(ids) == len(set(ids)), Counter(ids).most_common(3)  # no repeat in a pass
        assert set(ids) <= keys
    delivered = sum(len(ids) for ids in passes)
    assert delivered + dropped[0] == PASSES * len(keys)  # every miss is counted
    if not packing:
        # 13 samples: 0 workers drop 1 per pass (batch 2); 2 workers (7 + 6) drop 1 per pass
        assert dropped[0] == PASSES
        # a new order every pass (packing orders a pack buffer holding most of a worker's
        # share by length, so on this tiny split its passes may repeat an order)
        assert len({tuple(ids) for ids in passes}) == PASSES


@pytest.mark.timeout(60)
def test_the_seed_changes_the_order_of_the_passes(tiny_dataset, tokenizer):
    orders = []
    for seed_offset in (0, 1):
        loader = build_small_train_loader(
            tiny_dataset, tokenizer, num_workers=0, seed_offset=seed_offset
        )
        orders.append(_passes(loader, 2))
        loader.close()
    assert orders[0] != orders[1]
    assert all(len(set(ids)) == len(ids) for run in orders for ids in run)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("packing", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("num_workers", [0, 2], ids=["0_workers", "2_workers"])
def test_exact_passes_restore_at_every_step(tiny_dataset, tokenizer, num_workers, packing):
    def build():
        return build_small_train_loader(
            tiny_dataset, tokenizer, num_workers=num_workers, packing=packing
        )

    loader = build()
    batches = sum(len(list(loader)) for _ in range(PASSES))
    loader.close()
    report = assert_restores_at_every_step(
        build, steps=batches + 1, extract=batch_source_ids, close=EnergonSFTDataLoader.close
    )
    assert len(report.epoch_starts) == PASSES  # restores at and across every pass boundary


@pytest.mark.timeout(180)
@pytest.mark.parametrize("num_workers", [0, 2], ids=["0_workers", "2_workers"])
def test_exact_passes_in_loops_of_fixed_length_restore_at_every_step(
    tiny_dataset, tokenizer, num_workers
):
    # virtual_epoch_length > 0 in exact mode: loops of 5 batches over the stream of exact passes
    report = assert_restores_at_every_step(
        lambda: build_small_train_loader(
            tiny_dataset, tokenizer, num_workers=num_workers, loop_length=5
        ),
        steps=16,
        extract=batch_source_ids,
        close=EnergonSFTDataLoader.close,
    )
    assert report.epoch_starts == [5, 10, 15]
    ids = report.ids
    first_pass = ids[:12]  # 6 batches of 2 = the first pass (13 samples, 1 dropped)
    assert len(set(first_pass)) == 12


@pytest.mark.timeout(60)
def test_a_restore_at_a_pass_end_starts_the_next_pass_without_an_empty_loop(
    tiny_dataset, tokenizer
):
    loader = build_small_train_loader(tiny_dataset, tokenizer, num_workers=0)
    first, second = list(loader), list(loader)
    loader.close()
    loader = build_small_train_loader(tiny_dataset, tokenizer, num_workers=0)
    batches = iter(loader)
    for _ in first:
        next(batches)
    state = torch_roundtrip(loader.state_dict())  # after the pass's last batch, before its end
    loader.close()
    assert state["position"]["passes"] == 0 and state["position"]["pass_batches"] == len(first)
    restored = build_small_train_loader(tiny_dataset, tokenizer, num_workers=0)
    restored.load_state_dict(state)
    assert [batch_source_ids(b)[0] for b in restored] == [batch_source_ids(b)[0] for b in second]
    assert restored.completed_passes == 2


@pytest.mark.timeout(60)
def test_virtual_mode_windows_of_one_pass_repeat_and_miss_samples(tiny_dataset, tokenizer):
    # the documented difference: Energon's shuffle buffer straddles the pass boundaries
    loader = build_small_train_loader(
        tiny_dataset, tokenizer, num_workers=0, epoch_mode="virtual", loop_length=6
    )
    windows = [[i for b in stream(loader, batch_source_ids, 36) for i in b.ids]]
    loader.close()
    ids = windows[0]
    pass_windows = [ids[k : k + 12] for k in range(0, len(ids), 12)]
    assert any(len(set(w)) < len(w) for w in pass_windows)  # repeats inside one pass-sized window
    assert loader.dropped_samples == 0 and loader.completed_passes == 0


@pytest.mark.timeout(60)
def test_a_share_smaller_than_a_batch_is_a_clear_error(tiny_dataset, tokenizer):
    loader = build_small_train_loader(tiny_dataset, tokenizer, num_workers=0, batch_size=20)
    with pytest.raises(ValueError) as error:
        next(iter(loader))
    assert str(error.value) == (
        f"Energon source {tiny_dataset.path!r} (split 'train'): a whole pass of this rank "
        "yielded no batch; its 13 sample(s) did not fill one batch of batch_size 20 in any "
        "worker; use a smaller batch size, fewer workers or ranks, or more data"
    )


def test_epoch_mode_is_validated_and_pinned_by_the_identity(tiny_dataset, tokenizer):
    with pytest.raises(ValueError) as error:
        build_small_train_loader(tiny_dataset, tokenizer, num_workers=0, epoch_mode="once")
    assert "epoch_mode='once': Input should be 'exact' or 'virtual'" in str(error.value)
    exact = build_small_train_loader(tiny_dataset, tokenizer, num_workers=0, loop_length=4)
    virtual = build_small_train_loader(
        tiny_dataset, tokenizer, num_workers=0, epoch_mode="virtual", loop_length=4
    )
    assert exact.identity["source"]["epoch_mode"] == "exact"
    with pytest.raises(ValueError) as error:
        virtual.load_state_dict(exact.state_dict())
    assert str(error.value) == (
        "Energon loader identity changed: source.epoch_mode 'exact' -> 'virtual'"
    )
