"""Restore exactness of the Energon training loader across ``for`` loops, with and without workers.

Energon's own virtual epochs did not restore exactly with worker processes (torch restarts its
worker round-robin at worker 0 on every ``iter()``, a restored Energon loader has rotated its
workers): after a restore, the batches of later epochs came swapped in pairs. The loader now
iterates Energon once, endlessly, and cuts the ``for`` loops itself; these tests restore at
every step over several loops, reiterating at each loop end as the rank actor does.
"""

from __future__ import annotations

import pytest
import torch

from energon_fixtures import (
    batch_source_ids,
    make_loader,
    build_small_train_loader,
    write_chat_dataset,
)
from restore_check import assert_restores_at_every_step, stream, torch_roundtrip
from rl_data.energon.sft_dataloader import EnergonSFTDataLoader


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory, chat_conversations):
    """30 short conversations (2 turns), 10 shards of 3, all in the train split."""
    return write_chat_dataset(
        tmp_path_factory.mktemp("workers_small"),
        chat_conversations[:30],
        samples_per_shard=3,
        splits={"train": 1.0},
        max_messages=2,
    )


#: The audit's loader: 2 workers, batches of 4, shuffle buffer 20, loops of 5 batches.
AUDIT_LOADER = {"energon": {"shuffle_buffer_size": 20, "checkpoint_every_sec": 0.5}, "workers": 2, "max_sequence_length": 256}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("epoch_mode", ["virtual", "exact"])
def test_audit_reproducer_commit_one_step_then_restore(energon_dataset, tokenizer, epoch_mode):
    # 2 workers, batch 4, shuffle buffer 20, loops of 5: save after 1 step, restore into a fresh
    # loader; steps 6-9 (after the loop boundary) used to come as 7, 6, 9, 8.
    source = {"virtual_epoch_length": 5, "epoch_mode": epoch_mode}
    loader = make_loader(energon_dataset, tokenizer, **AUDIT_LOADER, source=source)
    reference = stream(loader, batch_source_ids, 12)
    loader.close()
    loader = make_loader(energon_dataset, tokenizer, **AUDIT_LOADER, source=source)
    first = stream(loader, batch_source_ids, 1)
    state = torch_roundtrip(loader.state_dict())
    loader.close()
    restored = make_loader(energon_dataset, tokenizer, **AUDIT_LOADER, source=source)
    restored.load_state_dict(state)
    rest = stream(restored, batch_source_ids, 11)
    restored.close()
    assert [s.ids for s in first] == [reference[0].ids]
    assert [s.ids for s in rest] == [s.ids for s in reference[1:]]
    assert [s.epoch for s in reference] == [0] * 5 + [1] * 5 + [2] * 2


@pytest.mark.timeout(300)
@pytest.mark.parametrize("loop_length", [5, 4], ids=["odd_loops", "even_loops"])
@pytest.mark.parametrize("packing", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("num_workers", [0, 2], ids=["0_workers", "2_workers"])
def test_virtual_loops_restore_at_every_step(
    small_dataset, tokenizer, num_workers, packing, loop_length
):
    report = assert_restores_at_every_step(
        lambda: build_small_train_loader(
            small_dataset,
            tokenizer,
            num_workers=num_workers,
            packing=packing,
            epoch_mode="virtual",
            loop_length=loop_length,
        ),
        steps=3 * loop_length + 1,
        extract=batch_source_ids,
        close=EnergonSFTDataLoader.close,
    )
    assert report.epoch_starts == [loop_length, 2 * loop_length, 3 * loop_length]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("packing", [False, True], ids=["unpacked", "packed"])
def test_a_chain_of_restores_with_workers_is_exact(small_dataset, tokenizer, packing):
    # Restore, take one batch (from one worker only), save, restore again: the other worker's
    # skip offset from the first restore must survive the second save.
    def build():
        return build_small_train_loader(
            small_dataset, tokenizer, num_workers=2, packing=packing, loop_length=4
        )

    loader = build()
    reference = stream(loader, batch_source_ids, 14)
    loader.close()
    for first_stop in (3, 6, 9):
        loader = build()
        stream(loader, batch_source_ids, first_stop)
        state = torch_roundtrip(loader.state_dict())
        loader.close()
        for position in (first_stop + 1, first_stop + 2):
            loader = build()
            loader.load_state_dict(state)
            taken = stream(loader, batch_source_ids, 1)
            state = torch_roundtrip(loader.state_dict())
            loader.close()
            assert taken[0].ids == reference[position - 1].ids, (first_stop, position)
        loader = build()
        loader.load_state_dict(state)
        rest = stream(loader, batch_source_ids, 14 - first_stop - 2)
        loader.close()
        assert [s.ids for s in rest] == [s.ids for s in reference[first_stop + 2 :]], first_stop


@pytest.mark.timeout(120)
def test_a_loader_dropped_without_close_stops_its_workers_at_once(small_dataset, tokenizer):
    # Energon's loader sits in a reference cycle: without the loader's own clean-up its workers
    # lived until a later garbage collection, which then waited 5 s per worker.
    loader = build_small_train_loader(small_dataset, tokenizer, num_workers=2, loop_length=4)
    batches = iter(loader)
    next(batches)
    workers = list(loader._loader._iterator._workers)
    assert len(workers) == 2 and all(worker.is_alive() for worker in workers)
    del batches, loader
    assert not any(worker.is_alive() for worker in workers)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("packing", [False, True], ids=["unpacked", "packed"])
def test_batches_from_workers_arrive_in_the_message_not_in_shared_memory(small_dataset, tokenizer, packing):
    # torch moves every tensor of a worker's item through its own shared-memory segment and
    # file-descriptor hand-over; the loader's workers send tensors up to 1 MB inside the message.
    loader = build_small_train_loader(small_dataset, tokenizer, num_workers=2, loop_length=4, packing=packing)
    try:
        batch = next(iter(loader))
    finally:
        loader.close()
    tensors = {key: value for key, value in batch.items() if isinstance(value, torch.Tensor)}
    assert "input_ids" in tensors
    assert not any(tensor.is_shared() for tensor in tensors.values()), {k: t.is_shared() for k, t in tensors.items()}
