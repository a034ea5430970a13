"""Checkpoints written by earlier releases restore with this code and continue the same stream.

``tests/data/checkpoint_stop33_packed_w2`` was written by commit 636f05d (the release before the
rank pool, the Energon compat package, the task layering and the typed loader spec) after 3
committed steps of 2 ranks, packed (first_fit_decreasing, buffer 8), 2 Energon workers per rank,
prefetch 2, over a byte-identical copy of ``energon_dataset`` (its index uuid is deterministic).
"""

from __future__ import annotations

from pathlib import Path

from distributed_fixtures import TIMEOUT_S, consume, reference_stream, running_coordinator, runtime_config, train_spec

DATA = Path(__file__).parent / "data"
PACKING = {"shuffle_buffer_size": 20, "max_samples_per_sequence": 10, "packing_buffer_size": 8, "num_workers": 2}


def test_a_packed_two_worker_checkpoint_of_the_previous_release_restores_fresh_and_by_rewind(ray_session, energon_dataset, tokenizer):
    ray = ray_session
    spec = train_spec(energon_dataset, data_config={"energon": PACKING, "shuffle": True}, packing_algorithm="first_fit_decreasing")
    config = runtime_config(2, 2)
    expected = reference_stream(spec, config, tokenizer, 5)
    saved = str(DATA / "checkpoint_stop33_packed_w2")
    with running_coordinator(ray, config, spec) as coordinator:
        assert ray.get(coordinator.load_checkpoint.remote(saved), timeout=TIMEOUT_S) == 3
        assert consume(ray, coordinator, 2) == expected[3:5]
        assert ray.get(coordinator.load_checkpoint.remote(saved), timeout=TIMEOUT_S) == 3  # a rewind
        assert consume(ray, coordinator, 2) == expected[3:5]
