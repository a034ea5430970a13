"""Node loss on a multi-node ``ray.cluster_utils.Cluster``: lost batches are re-delivered, and an
unplaceable bundle is named.

The driver connects to its own cluster, so these tests run in the ``own_cluster`` pytest process
(``pytest -m own_cluster``), never next to the session-wide ``ray_session``.
"""

from __future__ import annotations

import os
import shutil

import pytest

from distributed_fixtures import TIMEOUT_S, ids_of, reference_stream, runtime_config, train_spec
from rl_data.distributed.client import CoordinatorClient
from rl_data.distributed.coordinator import DataCoordinator, RankTimeoutError
from rl_data.distributed.placement import placement_group_name

pytestmark = [pytest.mark.own_cluster, pytest.mark.slow]

#: Every worker node hosts one rank (STRICT_SPREAD bundles need this resource).
NODE = {"num_cpus": 1, "resources": {"rank_slot": 1}, "object_store_memory": 80 * 1024 * 1024}


@pytest.fixture(scope="module")
def cluster():
    """A head without rank slots and two worker nodes with one each; the driver connected to it."""
    import ray
    from ray.cluster_utils import Cluster
    from ray_head import private_ray_dir

    if ray.is_initialized():
        pytest.fail("this driver is already connected to Ray: run node-loss tests alone with `pytest -m own_cluster`")
    temp_dir = private_ray_dir("cluster-")
    # Cluster writes the head's address to <default Ray temp dir>/ray_current_cluster whatever
    # temp_dir says; on a clean machine (the suite never uses /tmp/ray) that folder is missing.
    from ray._common.utils import get_default_ray_temp_dir

    os.makedirs(get_default_ray_temp_dir(), exist_ok=True)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "temp_dir": temp_dir,
            # a removed node is declared dead after ~1.5 s instead of ~30 s
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3},
        },
    )
    for _ in range(2):
        cluster.add_node(**NODE)
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _start_on_the_head(cluster, config, spec):
    """``start_data_coordinator``, but pinned to the head node, which the test never removes."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    handle = (
        ray.remote(DataCoordinator)
        .options(name=config.name, namespace=config.namespace, num_cpus=0, max_restarts=0,
                 scheduling_strategy=NodeAffinitySchedulingStrategy(cluster.head_node.node_id, soft=False))
        .remote(config, spec)
    )
    ray.get(handle.ready.remote(), timeout=config.control_timeout_s + 30)
    return handle


def _node_of_rank(cluster, config, rank):
    from ray.util.placement_group import placement_group_table

    name = placement_group_name(config)
    group = next(g for g in placement_group_table().values() if g["name"] == name and g["state"] != "REMOVED")
    node_id = group["bundles_to_node_id"][rank]
    return next(node for node in cluster.worker_nodes if node.node_id == node_id)


def _next_step_retrying(feed, tries=10):
    for _ in range(tries - 1):
        try:
            return feed.next_step()
        except RankTimeoutError:
            continue
    return feed.next_step()


@pytest.mark.timeout(420)
def test_batches_lost_with_their_node_are_redelivered_and_an_unplaceable_bundle_is_named(cluster, energon_dataset, tokenizer):
    import ray
    from ray.exceptions import ObjectLostError

    spec = train_spec(
        energon_dataset,
        data_config={"energon": {"shuffle_buffer_size": 20, "max_samples_per_sequence": 10, "packing_buffer_size": 8}, "shuffle": True},
        packing_algorithm="first_fit_decreasing",
        max_sequence_length=16384,
        sequence_length_pad_multiple=4096,  # ~400 KB batches: they live in the producing node's object store
    )
    config = runtime_config(
        2, 1, name="node_loss", strategy="STRICT_SPREAD", bundle_resources={"CPU": 0.25, "rank_slot": 1.0},
        control_timeout_s=30.0,
    )
    expected = reference_stream(spec, config, tokenizer, 6)
    handle = _start_on_the_head(cluster, config, spec)
    try:
        feed = CoordinatorClient(handle, timeout_s=TIMEOUT_S)
        step, refs = feed.next_step()
        assert (step, ids_of(ray, refs)) == (1, expected[0])
        feed.commit(step)
        step, held = feed.next_step()  # step 2 is handed out and held, not fetched yet
        assert step == 2

        cluster.remove_node(_node_of_rank(cluster, config, 1))
        with pytest.raises(ObjectLostError):  # rank 1's batch lived on the lost node
            ray.get(held[1], timeout=TIMEOUT_S)
        cluster.add_node(**NODE)
        # Asked again, step 2 comes back with fresh refs and the same samples (rank 1 replaced).
        assert ids_of(ray, feed.redeliver(2)) == expected[1]
        for index in (2, 3):
            step, refs = feed.next_step()
            assert (step, ids_of(ray, refs)) == (index + 1, expected[index])
        feed.commit(4)

        # No node left for rank 0's bundle: the error names the bundle, not only the rank.
        cluster.remove_node(_node_of_rank(cluster, config, 0))
        with pytest.raises(
            RankTimeoutError,
            match=r"rank 0 did not finish restoring the last committed state within 30 s \(its bundle 0 \{'CPU': 0\.25, 'rank_slot': 1\.0\} of the STRICT_SPREAD placement group is not placed on any node \(group state RESCHEDULING\): the cluster cannot satisfy the placement now; add nodes",
        ):
            feed.next_step()
        cluster.add_node(**NODE)
        steps = [_next_step_retrying(feed) for _ in range(2)]
        assert [(s, ids_of(ray, refs)) for s, refs in steps] == [(5, expected[4]), (6, expected[5])]
        feed.commit(6)
        assert feed.status()["restarts"] == [1, 1]
    finally:
        ray.get(handle.shutdown.remote(), timeout=TIMEOUT_S)
        ray.kill(handle, no_restart=True)
