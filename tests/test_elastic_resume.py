"""Elastic resume: G logical shards, checkpoints saved at one DP size restore at another (real Ray).

The reference is read from the G shards' loaders directly (no Ray); DP rank d of D must get the
batches of shards d, d+D, ... merged in that order, so every step's global batch is the same
set of samples at every D, and the merged rows keep the order stated in shard_map.

Each test passes checkpoints along a chain of coordinators, one per DP size: a coordinator
restores the previous one's checkpoint of every step (the first restore into a fresh
coordinator, then rewinds in place with a step pending; the last, of step 0, starts its own run,
which records its checkpoints for the next one). Rewinds cost a loader build per rank; rank actor
start-ups cost the time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from distributed_fixtures import (
    TIMEOUT_S,
    merged_by_dp,
    reference_stream,
    running_coordinator,
    runtime_config,
    train_spec,
    wait_until_name_is_free,
)
from restore_check import assert_resumes_from_every_state, record_steps

from rl_data.distributed.client import CoordinatorClient
from rl_data.distributed.config import LoaderSpec, ParallelLayout

#: Batches per virtual epoch: STEPS cross its boundary, and the checkpoint of step 2 lies on it.
EPOCH_BATCHES = 2
STEPS = 3
PACKED = {"data_config": {"energon": {"shuffle_buffer_size": 20, "max_samples_per_sequence": 10, "packing_buffer_size": 4},
                          "shuffle": True},
          "packing_algorithm": "first_fit_decreasing", "max_sequence_length": 1024, "sequence_length_pad_multiple": 8}


def _spec(dataset: Any, **overrides: Any) -> LoaderSpec:
    """``train_spec`` with virtual epochs of :data:`EPOCH_BATCHES` batches."""
    source = {"path": dataset.path, "split": "train", "virtual_epoch_length": EPOCH_BATCHES}
    return train_spec(dataset, source=source, **overrides)


def _config(dp: int, shards: int):
    """``shards`` shards of 1/8 CPU each (the session has 4 CPUs) fed to ``dp`` DP ranks; rank actors
    starting at once on 2 busy cores take ~30 s, so their timeouts are longer than the suite's."""
    return runtime_config(shards, 1, parallel_layout=ParallelLayout(dp=dp), logical_world_size=shards,
                          bundle_resources={"CPU": 0.125}, rank_actor_num_cpus=0.125,
                          control_timeout_s=3 * TIMEOUT_S, step_timeout_s=3 * TIMEOUT_S)


def _samples(step: list) -> list[str]:
    """The sample ids of one step's batches (a packed batch lists each pack's), sorted."""
    return sorted(i for batch in step for item in batch for i in (item if isinstance(item, list) else [item]))


def _resume_then_record(
    ray: Any,
    spec: LoaderSpec,
    dp: int,
    shards: int,
    reference: list,
    saved: list | None,
    *,
    after_first_step: Callable[[CoordinatorClient], None] | None = None,
) -> tuple[list, dict]:
    """At DP size ``dp``: resume from each of the checkpoints ``saved`` (at another DP size) of
    steps ``STEPS - 1`` .. 1, then from that of step 0 (without ``saved``: from the start) run the
    ``reference`` steps, recording this run's checkpoints (``after_first_step(client)`` runs after
    the first step); every step must give ``reference`` merged at ``dp``. Returns those checkpoints
    (``[k]``: after k steps) and the coordinator's status."""
    expected = merged_by_dp(reference, dp)
    assert [_samples(step) for step in expected] == [_samples(step) for step in reference]  # the same global batches
    with running_coordinator(ray, _config(dp, shards), spec) as coordinator:
        client = CoordinatorClient(coordinator, timeout_s=3 * TIMEOUT_S)
        handed_steps = []

        def take() -> list[list[str]]:  # [dp rank] -> sample ids (a packed batch lists each pack's)
            step, refs = client.next_step()
            handed_steps.append(step)
            ids = [list(batch["source_ids"]) for batch in ray.get(refs, timeout=3 * TIMEOUT_S)]
            client.commit(step)
            return ids

        def leave_a_step_pending() -> None:  # from the second restore on, a rewind drops it
            if handed_steps:
                client.next_step()

        if saved is not None:  # saved[k]: after k steps; k = 0 starts the recorded run
            assert_resumes_from_every_state(
                take, client.load_state_dict, saved, expected, before_restore=leave_a_step_pending, down_to=1
            )
            leave_a_step_pending()
            client.load_state_dict(saved[0])

        own_steps = []

        def take_own_step() -> list[list[str]]:
            own_steps.append(take())
            if len(own_steps) == 1 and after_first_step is not None:
                after_first_step(client)
            return own_steps[-1]

        steps, checkpoints = record_steps(take_own_step, client.state_dict, len(reference))
        status = client.status()
    assert steps == expected, f"dp={dp}: the steps differ from the reference merged at dp {dp}"
    assert all(state["consumer_layout"]["dp"] == dp for state in checkpoints)
    return checkpoints, status


def _kill_rank_actor(ray: Any, rank: int) -> Callable[[CoordinatorClient], None]:
    def kill(client: CoordinatorClient) -> None:
        name = client.status()["rank_actor_names"][rank]
        ray.kill(ray.get_actor(name, namespace="rl_data_tests"), no_restart=True)
        wait_until_name_is_free(name, "rl_data_tests", TIMEOUT_S)

    return kill


@pytest.mark.timeout(600)
def test_checkpoints_of_every_step_at_dp_2_restore_at_dp_1_with_a_rank_actor_killed_mid_run(
    ray_session, energon_dataset, tokenizer
):
    """G = 2, unpacked: DP 2 -> DP 1 (both shards merged into one DP rank), whose rank actor 1 is
    killed after the first step of its own run; no step loses or repeats a sample. (G = 4 along
    DP 2 -> 1 -> 4, packed: the slow test below.)"""
    ray, shards = ray_session, 2
    spec = _spec(energon_dataset)
    reference = reference_stream(spec, _config(shards, shards), tokenizer, STEPS)
    seen = [i for step in reference for rank in step for i in rank]  # 3 batches of 2 of each shard
    assert len(seen) == len(set(seen)) == STEPS * shards * 2

    saved, _ = _resume_then_record(ray, spec, 2, shards, reference, None)
    _, status = _resume_then_record(ray, spec, 1, shards, reference, saved, after_first_step=_kill_rank_actor(ray, 1))
    assert status["restarts"] == [0, 1]
    assert status["rewinds"] == STEPS - 1  # the first restore loads into a fresh coordinator


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_packed_checkpoints_of_every_step_restore_at_dp_2_1_4_of_4_shards(ray_session, energon_dataset, tokenizer):
    """G = 4, packed (a batch lists each pack's samples): DP 2 -> DP 1 -> DP 4 (shard refs
    handed out as they are): 2, then 4, then 1 shard per DP rank, down then up (as G = 8 at DP
    4 -> 2 -> 8, at half the rank actors)."""
    ray, shards = ray_session, 4
    spec = _spec(energon_dataset, **PACKED)
    reference = reference_stream(spec, _config(shards, shards), tokenizer, STEPS)
    saved = None
    for dp in (2, 1, 4):
        saved, status = _resume_then_record(ray, spec, dp, shards, reference, saved)
        assert status["restarts"] == [0] * shards
