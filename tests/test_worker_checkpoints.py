"""Rank states with Energon workers come from the checkpoints the workers send with their items.

The loader must never wait on a worker round trip for a state (Energon's ``save_state_rank``
waits until every worker finished the batch it is making), and its answer must be the one
Energon's workers would give for the same delivered position.
"""

from __future__ import annotations

import pytest

from energon_fixtures import build_small_train_loader
from rl_data.energon.state_codec import encode_rank_state


def _live_state(stream, energon_loader):
    """Energon's own answer (a ``get_checkpoint`` round trip to every worker) at the stream's
    delivered position."""
    saved = energon_loader._worker_sample_counters, energon_loader._next_worker_id
    energon_loader._worker_sample_counters = list(stream._delivered)
    energon_loader._next_worker_id = stream.position.cursor
    try:
        return energon_loader.save_state_rank()
    finally:
        energon_loader._worker_sample_counters, energon_loader._next_worker_id = saved


def _assert_same_position(mirrored, live, step):
    """Equal states, except that a worker which has delivered nothing yet may be answered with
    "initial state" (None, as Energon's ``get_initial_checkpoint``) where the worker itself
    answers with the checkpoint it stored when it started (sample index 0): the same position."""
    assert (mirrored.next_worker_id, mirrored.micro_batch_size) == (live.next_worker_id, live.micro_batch_size)
    assert len(mirrored.worker_states) == len(live.worker_states)
    for worker, (ours, theirs) in enumerate(zip(mirrored.worker_states, live.worker_states)):
        where = f"step {step}, worker {worker}"
        assert ours.offset == theirs.offset, where
        if ours.state is None and theirs.state is not None:
            assert theirs.state.sample_index == 0, where
        else:
            assert encode_rank_state(ours) == encode_rank_state(theirs), where


@pytest.mark.timeout(180)
@pytest.mark.parametrize("checkpoint_every_sec", [0, 0.5], ids=["every_item", "every_half_second"])
@pytest.mark.parametrize("packing", [False, True], ids=["unpacked", "packed"])
def test_states_come_without_asking_the_workers_and_equal_energons_answer(
    energon_dataset, tokenizer, packing, checkpoint_every_sec, monkeypatch
):
    loader = build_small_train_loader(energon_dataset, tokenizer, num_workers=2, packing=packing)
    energon_loader, stream = loader._loader, loader._stream
    energon_loader.dataset.checkpoint_every_sec = checkpoint_every_sec  # before the workers fork
    asked = []
    live_command = energon_loader._worker_command
    monkeypatch.setattr(energon_loader, "_worker_command", lambda *args: asked.append(args) or live_command(*args))
    batches = iter(loader)
    try:
        for step in range(14):
            next(batches)
            state = loader.state_dict()  # the rank's state: no round trip
            assert asked == [], f"step {step}: the state asked the workers"
            mirrored = stream.energon_state()
            stream._hold.release()  # a held worker answers no command (worker_hold)
            live = _live_state(stream, energon_loader)
            assert len(asked) == 1
            asked.clear()
            _assert_same_position(mirrored, live, step)
            # the checkpoints reused from earlier states (only the worker of the batch sent a
            # new one) give the bytes a full encode gives; the cache keeps only the live ones
            assert state["loader_state"].numpy().tobytes() == encode_rank_state(mirrored)
            assert 0 < len(stream.encoded_worker_states) <= 4, len(stream.encoded_worker_states)
    finally:
        loader.close()
