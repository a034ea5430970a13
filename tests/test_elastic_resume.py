"""Elastic resume: G logical shards, checkpoints saved at one DP size restore at another (real Ray).

The reference is read from the G shards' loaders directly (no Ray); DP rank d of D must get the
batches of shards d, d+D, ... merged in that order, so every step's global batch is the same
set of samples at every D, and the merged rows keep the order stated in shard_map.

Each test passes checkpoints along a chain of coordinators, one per DP size: a coordinator
restores the previous one's checkpoint of every step (the first restore into a fresh
coordinator, then rewinds in place with a step pending), then records its own from the start
for the next one. Rewinds cost a loader build per rank; rank actor start-ups cost the time.
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

STEPS = 6  # across the 5-batch virtual epoch boundary of train_spec
PACKED = {"data_config": {"energon": {"shuffle_buffer_size": 20, "max_samples_per_sequence": 10, "packing_buffer_size": 4},
                          "shuffle": True},
          "packing_algorithm": "first_fit_decreasing", "max_sequence_length": 1024, "sequence_length_pad_multiple": 8}


def _config(dp: int, shards: int):
    """``shards`` shards of 1/8 CPU each (the session has 4 CPUs) fed to ``dp`` DP ranks; 8 rank
    actors starting at once on 2 cores take ~30 s, so their timeouts are longer than the suite's."""
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
    """At DP size ``dp``: resume from every one of the checkpoints ``saved`` (at another DP size),
    then run the ``reference`` steps from the start (``after_first_step(client)`` runs after the
    first); every step must give ``reference`` merged at ``dp``. Returns this run's checkpoints
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

        if saved is not None:
            assert_resumes_from_every_state(take, client.load_state_dict, saved, expected, before_restore=leave_a_step_pending)
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
def test_checkpoints_of_every_step_at_dp_4_restore_at_dp_1_with_a_rank_actor_killed_mid_run(
    ray_session, energon_dataset, tokenizer
):
    """G = 4, unpacked: DP 4 -> DP 1, whose rank actor 3 is killed after the first step of its own
    run; no step loses or repeats a sample."""
    ray, shards = ray_session, 4
    spec = train_spec(energon_dataset)
    reference = reference_stream(spec, _config(shards, shards), tokenizer, STEPS)
    seen = [i for step in reference for rank in step for i in rank]  # 6 batches of 2 of each shard's 48
    assert len(seen) == len(set(seen)) == STEPS * shards * 2

    saved, _ = _resume_then_record(ray, spec, 4, shards, reference, None)
    _, status = _resume_then_record(ray, spec, 1, shards, reference, saved, after_first_step=_kill_rank_actor(ray, 3))
    assert status["restarts"] == [0, 0, 0, 1]
    assert status["rewinds"] == STEPS  # the first restore loads into a fresh coordinator


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_packed_checkpoints_of_every_step_restore_at_dp_4_2_8_of_8_shards(ray_session, energon_dataset, tokenizer):
    """G = 8, packed (a batch lists each pack's samples): DP 4 -> DP 2 -> DP 8 (shard refs
    handed out as they are)."""
    ray, shards = ray_session, 8
    spec = train_spec(energon_dataset, **PACKED)
    reference = reference_stream(spec, _config(shards, shards), tokenizer, STEPS)
    saved = None
    for dp in (4, 2, 8):
        saved, status = _resume_then_record(ray, spec, dp, shards, reference, saved)
        assert status["restarts"] == [0] * shards
