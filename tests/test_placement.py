"""Placement fingerprint (pure) and placement groups for rank actors (real Ray)."""

from __future__ import annotations

import hashlib
import json

import pytest
from pydantic import ValidationError

from rl_data.distributed.config import ParallelLayout, RuntimeConfig
from rl_data.distributed.placement import (
    adopt_placement_group,
    config_layout,
    consumer_layout,
    create_rank_placement,
    placement_fingerprint,
    placement_layout,
)


def _layout(**overrides):
    args = dict(world_size=2, bundles=[{"CPU": 1}, {"CPU": 1}], strategy="PACK")
    args.update(overrides)
    return placement_layout(**args)


def test_layout_is_plain_canonical_json():
    assert _layout() == {
        "version": 2,
        "logical_world_size": 2,
        "bundles": [{"CPU": 1.0}, {"CPU": 1.0}],
        "strategy": "PACK",
    }
    expected = hashlib.sha256(json.dumps(_layout(), sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert placement_fingerprint(_layout()) == expected


def test_fingerprint_is_stable_and_changes_with_every_layout_field():
    base = placement_fingerprint(_layout())
    assert placement_fingerprint(_layout(bundles=[{"CPU": 1.0}, {"CPU": 1}])) == base  # int/float alike
    variants = [
        _layout(world_size=3, bundles=[{"CPU": 1}] * 3),
        _layout(bundles=[{"CPU": 1}, {"CPU": 2}]),
        _layout(bundles=[{"CPU": 1, "GPU": 1}, {"CPU": 1}]),
        _layout(strategy="SPREAD"),
    ]
    fingerprints = {placement_fingerprint(v) for v in variants}
    assert len(fingerprints) == len(variants) and base not in fingerprints


def test_layout_needs_one_bundle_per_rank():
    with pytest.raises(ValueError, match=r"placement has 1 rank bundles for logical world size 2"):
        _layout(bundles=[{"CPU": 1}])


def test_config_layout_uses_the_config_and_leaves_the_consumer_layout_out():
    config = RuntimeConfig(parallel_layout=ParallelLayout(dp=2, tp=4), bundle_resources={"CPU": 0.5}, rank_actor_num_cpus=0.5, strategy="SPREAD")
    assert config_layout(config) == _layout(bundles=[{"CPU": 0.5}] * 2, strategy="SPREAD")
    assert consumer_layout(config) == {"cp": 1, "dp": 2, "pp": 1, "tp": 4}
    # the same 8 shards fed to 1, 2, 4 or 8 DP ranks (any TP/PP/CP): one data layout, one fingerprint
    layouts = {
        placement_fingerprint(config_layout(RuntimeConfig(parallel_layout=ParallelLayout(dp=dp, tp=tp), logical_world_size=8)))
        for dp in (1, 2, 4, 8) for tp in (1, 2)
    }  # fmt: skip
    assert len(layouts) == 1


def test_config_refuses_inconsistent_values():
    with pytest.raises(ValidationError, match=r"parallel_layout.dp=3 does not divide the 4 logical data shards .* one of \[1, 2, 4\]"):
        RuntimeConfig(parallel_layout=ParallelLayout(dp=3), logical_world_size=4)
    with pytest.raises(ValidationError, match=r"parallel_layout.dp=4 does not divide the 2 logical data shards"):
        RuntimeConfig(parallel_layout=ParallelLayout(dp=4), logical_world_size=2)
    assert RuntimeConfig(parallel_layout=ParallelLayout(dp=2), logical_world_size=8).world_size == 8
    with pytest.raises(ValidationError, match=r"rank_actor_num_cpus=2.0 does not fit in a bundle with CPU=1.0"):
        RuntimeConfig(parallel_layout=ParallelLayout(dp=1), rank_actor_num_cpus=2)
    with pytest.raises(ValidationError, match=r"injected_delay_s names ranks \[2\] outside \[0, 2\)"):
        RuntimeConfig(parallel_layout=ParallelLayout(dp=2), injected_delay_s={2: 1.0})
    with pytest.raises(ValidationError, match=r"strategy"):
        RuntimeConfig(parallel_layout=ParallelLayout(dp=2), strategy="ANYWHERE")
    with pytest.raises(ValidationError, match=r"prefetch_depth"):
        RuntimeConfig(parallel_layout=ParallelLayout(dp=2), prefetch_depth=-1)


def test_created_placement_group_puts_each_rank_in_its_bundle(ray_session):
    ray = ray_session
    config = RuntimeConfig(parallel_layout=ParallelLayout(dp=2), bundle_resources={"CPU": 0.25}, rank_actor_num_cpus=0.25)
    placement = create_rank_placement(config)
    try:
        assert ray.get(placement.placement_group.ready(), timeout=30)
        assert placement.bundle_of_rank == (0, 1) and placement.owns_placement_group
        assert placement.fingerprint == placement_fingerprint(config_layout(config))

        @ray.remote(num_cpus=0.25)
        def where():
            from ray.util import get_current_placement_group

            return get_current_placement_group().id.hex()

        refs = [where.options(scheduling_strategy=placement.scheduling_strategy(r)).remote() for r in range(2)]
        assert ray.get(refs, timeout=30) == [placement.placement_group.id.hex()] * 2
    finally:
        placement.release()


def test_adopted_placement_group_fingerprints_the_ranks_bundles(ray_session):
    from ray.util.placement_group import placement_group, remove_placement_group

    ray = ray_session
    config = RuntimeConfig(parallel_layout=ParallelLayout(dp=2), rank_actor_num_cpus=0.25)
    group = placement_group([{"CPU": 0.5}, {"CPU": 0.25}, {"CPU": 0.5}], strategy="SPREAD")
    try:
        ray.get(group.ready(), timeout=30)
        placement = adopt_placement_group(group, [2, 1], config)
        assert placement.bundle_of_rank == (2, 1) and not placement.owns_placement_group
        assert placement.layout == _layout(bundles=[{"CPU": 0.5}, {"CPU": 0.25}], strategy="SPREAD")
        placement.release()  # never removes a user's group
        assert ray.get(group.ready(), timeout=30)
        with pytest.raises(ValueError, match=r"bundle_of_rank has 1 entries for logical world size 2"):
            adopt_placement_group(group, [0], config)
        with pytest.raises(ValueError, match=r"bundle indices \[3\] are outside the placement group's 3 bundles"):
            adopt_placement_group(group, [0, 3], config)
        big = RuntimeConfig(parallel_layout=ParallelLayout(dp=2), rank_actor_num_cpus=0.5)
        with pytest.raises(ValueError, match=r"bundles of ranks \[1\] have fewer CPUs than rank_actor_num_cpus=0.5"):
            adopt_placement_group(group, [0, 1], big)
    finally:
        remove_placement_group(group)
