"""Elastic resume: G = 8 logical shards, checkpoints saved at one DP size restore at another (real Ray).

The reference is read from the 8 shards' loaders directly (no Ray); DP rank d of D must get the
batches of shards d, d+D, ... merged in that order, so every step's global batch is the same
set of samples at every D, and the merged rows keep the order stated in shard_map.
"""

from __future__ import annotations

from collections import Counter

import pytest
from distributed_fixtures import (
    TIMEOUT_S,
    consume,
    merged_by_dp,
    reference_stream,
    running_coordinator,
    runtime_config,
    train_spec,
    wait_until_name_is_free,
)

from rl_data.distributed.config import ParallelLayout

SHARDS, SAVE_DP, SAVE_AFTER, RESUME_STEPS = 8, 4, 3, 3
PACKED = {"data_config": {"energon": {"shuffle_buffer_size": 20, "max_samples_per_sequence": 10, "packing_buffer_size": 4},
                          "shuffle": True},
          "packing_algorithm": "first_fit_decreasing", "max_sequence_length": 1024, "sequence_length_pad_multiple": 8}


def _config(dp: int, shards: int = SHARDS, **overrides):
    """``shards`` shards of 1/8 CPU each (the session has 4 CPUs) fed to ``dp`` DP ranks; 8 rank
    actors starting at once on 2 cores take ~30 s, so their timeouts are longer than the suite's."""
    return runtime_config(shards, 1, parallel_layout=ParallelLayout(dp=dp), logical_world_size=shards,
                          bundle_resources={"CPU": 0.125}, rank_actor_num_cpus=0.125,
                          control_timeout_s=3 * TIMEOUT_S, step_timeout_s=3 * TIMEOUT_S, **overrides)


def _samples(rank_batch: list) -> list[str]:
    """Sample ids of one batch (a packed batch lists the samples of each pack)."""
    return [i for item in rank_batch for i in (item if isinstance(item, list) else [item])]


def _global(step: list[list]) -> Counter:
    return Counter(i for rank in step for i in _samples(rank))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("packing", [False, True], ids=["unpacked", "packed"])
def test_a_checkpoint_saved_at_dp_4_restores_at_dp_1_2_and_8_with_the_same_global_batches(
    ray_session, energon_dataset, tokenizer, tmp_path, packing
):
    ray = ray_session
    spec = train_spec(energon_dataset, **(PACKED if packing else {}))
    reference = reference_stream(spec, _config(SHARDS), tokenizer, SAVE_AFTER + RESUME_STEPS)
    with running_coordinator(ray, _config(SAVE_DP), spec) as coordinator:
        before = consume(ray, coordinator, SAVE_AFTER)
        ray.get(coordinator.save_checkpoint.remote(str(tmp_path)), timeout=TIMEOUT_S)
        assert ray.get(coordinator.status.remote(), timeout=TIMEOUT_S)["dp"] == SAVE_DP
    assert before == merged_by_dp(reference[:SAVE_AFTER], SAVE_DP)
    for dp in (1, 2, 8):
        with running_coordinator(ray, _config(dp), spec) as coordinator:
            assert ray.get(coordinator.load_checkpoint.remote(str(tmp_path)), timeout=3 * TIMEOUT_S) == SAVE_AFTER
            resumed = consume(ray, coordinator, RESUME_STEPS)
        assert resumed == merged_by_dp(reference[SAVE_AFTER:], dp), f"dp={dp}"
        # the per-step global multiset of samples does not depend on the DP size
        assert [_global(s) for s in resumed] == [_global(s) for s in reference[SAVE_AFTER:]]
    if not packing:  # 6 batches of 2 of each shard's 24 samples: one pass, nothing twice
        seen = [i for step in reference for rank in step for i in _samples(rank)]
        assert len(seen) == len(set(seen)) == 6 * SHARDS * 2


@pytest.mark.timeout(600)
def test_a_dp_change_combined_with_a_rank_actor_killed_mid_run_loses_and_repeats_nothing(
    ray_session, energon_dataset, tokenizer, tmp_path
):
    ray = ray_session
    spec = train_spec(energon_dataset)
    reference = reference_stream(spec, _config(4, shards=4), tokenizer, 6)
    with running_coordinator(ray, _config(4, shards=4), spec) as coordinator:
        consume(ray, coordinator, 2)
        ray.get(coordinator.save_checkpoint.remote(str(tmp_path)), timeout=TIMEOUT_S)
    with running_coordinator(ray, _config(2, shards=4), spec) as coordinator:
        ray.get(coordinator.load_checkpoint.remote(str(tmp_path)), timeout=TIMEOUT_S)
        steps = consume(ray, coordinator, 1)
        name = ray.get(coordinator.status.remote(), timeout=TIMEOUT_S)["rank_actor_names"][3]
        ray.kill(ray.get_actor(name, namespace="rl_data_tests"), no_restart=True)
        wait_until_name_is_free(name, "rl_data_tests", TIMEOUT_S)
        steps += consume(ray, coordinator, 3)
        status = ray.get(coordinator.status.remote(), timeout=TIMEOUT_S)
    assert status["restarts"] == [0, 0, 0, 1]
    assert steps == merged_by_dp(reference[2:6], 2)
