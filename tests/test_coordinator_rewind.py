"""DataCoordinator rewind: a checkpoint loaded into a live coordinator, at every step; its origin;
a restore refused while another is in flight; a refused checkpoint changes nothing; lifetimes.

The tests of a live coordinator of the default configuration share one (``coordinator``: rewound to
step 0 at each test's start); the lifetime test runs on the synthetic task (:data:`SYNTHETIC`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from distributed_fixtures import (
    TIMEOUT_S,
    cached_reference_stream,
    consume,
    origin_checkpoint,
    running_coordinator,
    runtime_config,
    shared_train_coordinator,
    synthetic_reference_stream,
    train_spec,
    wait_for,
)
from energon_fixtures import write_chat_dataset
from restore_check import assert_rewinds_at_every_step
from rl_data.distributed.client import CoordinatorClient, CoordinatorNotFoundError, get_coordinator, wait_until_name_is_free
from rl_data.tasks.synthetic import synthetic_loader_spec

STEPS = 6  # across the 5-batch virtual epoch boundary of train_spec

PACKING = {"shuffle_buffer_size": 20, "max_samples_per_sequence": 10, "packing_buffer_size": 8}


def _spec(dataset, workers: int, packed: bool):
    if not packed:
        return train_spec(dataset, workers)
    energon = {**PACKING, "num_workers": workers}
    return train_spec(dataset, data_config={"energon": energon, "shuffle": True}, packing_algorithm="first_fit_decreasing")


#: For the tests whose subject is the runtime itself, not Energon: rank actors that import no torch,
#: tokenizer or Energon (~0.6 CPU-s to start instead of ~3.2); 3 batches of 2 per pass of 7 samples.
SYNTHETIC = synthetic_loader_spec(batch_size=2, samples_per_rank=7, tokens_per_sample=5, name="synthetic-rewind")


@pytest.fixture(scope="module")
def shared_coordinator(ray_session, energon_dataset):
    yield from shared_train_coordinator(ray_session, energon_dataset, "test_coordinator_rewind_shared")


@pytest.fixture
def coordinator(shared_coordinator):
    """The shared coordinator rewound to its start: step 0, nothing pending (its rewinds and restarts go on)."""
    return shared_coordinator.reset()


#: The configuration of the shared coordinator (``shared_train_coordinator``): its parameter rewinds it.
SHARED = (0, False, 1)


@pytest.mark.parametrize(
    "workers,packed,prefetch_depth",
    [
        SHARED,  # (0, False, 0), with prefetch 0: test_coordinator.py::test_restore_continues_exactly_after_the_committed_step[0-2-0]
        (2, True, 2),
        pytest.param(0, True, 1, marks=pytest.mark.slow),
        pytest.param(2, False, 0, marks=pytest.mark.slow),
    ],
)
def test_rewind_at_every_step_continues_exactly(ray_session, energon_dataset, tokenizer, request, workers, packed, prefetch_depth):
    """Rewind a live coordinator (a step pending, ranks prefetching) to the checkpoint of every
    step s = STEPS-1 .. 0 and take the rest: the ids equal the uninterrupted run's, in order.
    The :data:`SHARED` configuration rewinds the shared coordinator (its counts relative to this test's start)."""
    ray = ray_session
    spec, config = _spec(energon_dataset, workers, packed), runtime_config(2, prefetch_depth)
    expected = cached_reference_stream(spec, config, tokenizer, STEPS)
    if (workers, packed, prefetch_depth) == SHARED:
        shared = request.getfixturevalue("shared_coordinator")
        assert (shared.spec, shared.config.prefetch_depth) == (spec, prefetch_depth)
        live = contextlib.nullcontext(shared.reset())
    else:
        live = running_coordinator(ray, config, spec)
    with live as coordinator:
        client = CoordinatorClient(coordinator, timeout_s=TIMEOUT_S)
        before = client.status()

        def take() -> list[str]:
            step, refs = client.next_step()
            ids = [i for batch in ray.get(refs, timeout=TIMEOUT_S) for i in batch["source_ids"]]
            client.commit(step)
            return ids

        pending = lambda: client.next_step()  # noqa: E731 - a pending step, and prefetched ones, are dropped
        reference = assert_rewinds_at_every_step(take, client.state_dict, client.load_state_dict, STEPS, before_rewind=pending)
        status = client.status()
    assert reference == [[i for rank in step for i in rank] for step in expected]
    # the same rank actors (processes), each with a new loader; rewinds are not rank deaths
    assert status["rank_actor_names"] == before["rank_actor_names"]
    assert [r["pid"] for r in status["ranks"]] == [r["pid"] for r in before["ranks"]]
    assert status["restarts"] == before["restarts"] and status["rewinds"] - before["rewinds"] == STEPS


def test_rewind_drops_pending_steps_and_refuses_their_commits(ray_session, shared_coordinator, coordinator, tokenizer):
    ray = ray_session
    expected = cached_reference_stream(shared_coordinator.spec, shared_coordinator.config, tokenizer, 4)
    client = CoordinatorClient(coordinator, timeout_s=TIMEOUT_S)
    assert [client.next_step()[0] for _ in range(2)] == [1, 2]
    client.commit(1)
    checkpoint = client.state_dict()
    step, stale_refs = client.next_step()  # step 3 pending, its refs held by this consumer
    after_three = client.state_dict(step=3)  # the checkpoint after a pending step, before its commit
    assert after_three["step"] == 3
    with pytest.raises(
        ValueError,
        match=r"no checkpoint of step 4: the last committed step is 1 and the pending steps are 2..3",
    ):
        client.state_dict(step=4)
    assert client.load_state_dict(checkpoint) == 1
    # the dropped steps: a commit or re-delivery is refused, naming what is pending
    with pytest.raises(ValueError, match=r"cannot commit step 3: the last step handed out is 1"):
        client.commit(3)
    with pytest.raises(
        ValueError,
        match=r"cannot re-deliver step 2: the pending steps \(handed out, not committed\) are none",
    ):
        client.redeliver(2)
    with pytest.raises(
        ValueError,
        match=r"cannot hand out step 4: the pending steps are none and the next new step is 2",
    ):
        client.next_step(expected_step=4)
    # refs handed out before the rewind stay readable while held (the data of the old step 3)
    assert [list(b["source_ids"]) for b in ray.get(stale_refs, timeout=TIMEOUT_S)] == expected[2]
    # every DP worker asks for the same step and gets the same refs; one commits
    first = CoordinatorClient(coordinator, timeout_s=TIMEOUT_S).next_step(expected_step=2)
    second = CoordinatorClient(coordinator, timeout_s=TIMEOUT_S).next_step(expected_step=2)
    assert first[0] == second[0] == 2 and first[1] == second[1]
    assert [list(b["source_ids"]) for b in ray.get(first[1], timeout=TIMEOUT_S)] == expected[1]
    client.commit(2)
    assert consume(ray, coordinator, 2) == expected[2:4]
    client.load_state_dict(after_three)
    assert consume(ray, coordinator, 1) == expected[3:4]


def test_a_second_restore_while_one_is_in_flight_is_refused(ray_session, coordinator):
    """Ray may start an async actor's calls out of order and a rewind lasts well under a second, so
    the first restore is held in flight (rank 0's process stopped: the rewind waits for it) and seen
    in flight in the coordinator's status before the second is sent."""
    ray = ray_session
    consume(ray, coordinator, 2)
    checkpoint = ray.get(coordinator.state_dict.remote(), timeout=TIMEOUT_S)
    consume(ray, coordinator, 1)

    def status() -> dict:
        return ray.get(coordinator.status.remote(), timeout=TIMEOUT_S)

    def first_restore_in_flight() -> bool:  # ~10 s: the stopped rank does not answer (no CPU meanwhile)
        return status()["restore_failure"] == "restoring the checkpoint of step 2 did not finish"

    rank_0 = next(rank["pid"] for rank in status()["ranks"] if rank["rank"] == 0)
    os.kill(rank_0, signal.SIGSTOP)
    try:
        first = coordinator.load_state_dict.remote(checkpoint)  # a rewind: waits for rank 0
        wait_for(first_restore_in_flight, "the first restore in flight")
        second = coordinator.load_state_dict.remote(checkpoint)
        with pytest.raises(
            RuntimeError,
            match=r"load_state_dict refused: another restore of this coordinator is in flight",
        ):
            ray.get(second, timeout=TIMEOUT_S)
    finally:
        os.kill(rank_0, signal.SIGCONT)
    ray.get(first, timeout=TIMEOUT_S)
    assert ray.get(coordinator.progress.remote(), timeout=TIMEOUT_S)["committed_step"] == 2
    # once it finished, restoring again is allowed
    ray.get(coordinator.load_state_dict.remote(checkpoint), timeout=TIMEOUT_S)


def test_a_refused_checkpoint_leaves_the_live_coordinator_untouched(
    ray_session, shared_coordinator, coordinator, tokenizer, tmp_path_factory, chat_conversations
):
    ray = ray_session
    other = write_chat_dataset(tmp_path_factory.mktemp("rewind_other"), chat_conversations[240:480], samples_per_shard=12)
    spec, config = shared_coordinator.spec, shared_coordinator.config
    # the checkpoint a coordinator of this configuration over the other dataset starts from
    foreign = origin_checkpoint(train_spec(other), config, tokenizer, like=shared_coordinator.initial)
    expected = cached_reference_stream(spec, config, tokenizer, 4)
    rewinds = ray.get(coordinator.progress.remote(), timeout=TIMEOUT_S)["rewinds"]
    assert consume(ray, coordinator, 2) == expected[:2]
    consume(ray, coordinator, 1, commit=False)  # step 3 pending
    names = ray.get(coordinator.status.remote(), timeout=TIMEOUT_S)["rank_actor_names"]
    with pytest.raises(ValueError, match=r"rank 0: Energon loader identity changed: dataset.index_uuid"):
        ray.get(coordinator.load_state_dict.remote(foreign), timeout=TIMEOUT_S)
    status = ray.get(coordinator.status.remote(), timeout=TIMEOUT_S)
    assert status["rank_actor_names"] == names and status["rewinds"] == rewinds
    assert (status["committed_step"], status["handed_step"]) == (2, 3)
    step, refs = ray.get(coordinator.next_step.remote(expected_step=3), timeout=TIMEOUT_S)  # re-delivered
    assert [list(b["source_ids"]) for b in ray.get(refs, timeout=TIMEOUT_S)] == expected[2]
    ray.get(coordinator.commit.remote(step), timeout=TIMEOUT_S)
    assert consume(ray, coordinator, 1) == expected[3:4]


def test_origin_is_the_start_or_the_checkpoint_loaded_before_the_first_step(ray_session, shared_coordinator, coordinator, tokenizer):
    """A coordinator's origin is its start (the shared one: no test of this module loads a checkpoint
    into it before its first step), or the checkpoint loaded before its first step (a fresh one of the
    same configuration); a rewind keeps it."""
    ray = ray_session
    spec, config = shared_coordinator.spec, runtime_config(2, 1)
    expected = cached_reference_stream(spec, config, tokenizer, 5)
    consume(ray, coordinator, 2)
    at_two = ray.get(coordinator.state_dict.remote(), timeout=TIMEOUT_S)
    consume(ray, coordinator, 2)
    origin = ray.get(coordinator.origin_state_dict.remote(), timeout=TIMEOUT_S)
    assert origin["step"] == 0
    ray.get(coordinator.load_state_dict.remote(origin), timeout=TIMEOUT_S)  # start over
    assert consume(ray, coordinator, 1) == expected[:1]
    with running_coordinator(ray, config, spec) as coordinator:  # the same configuration, another name
        client = CoordinatorClient(coordinator, timeout_s=TIMEOUT_S)
        assert client.origin_state_dict()["step"] == 0
        client.load_state_dict(at_two)  # before the first step: the new origin
        assert consume(ray, coordinator, 2) == expected[2:4]
        client.load_state_dict(at_two)  # a rewind keeps the origin
        assert client.progress() == {"committed_step": 2, "handed_step": 2, "origin_step": 2, "rewinds": 1}
        consume(ray, coordinator, 2)
        client.load_state_dict(client.origin_state_dict())
        assert consume(ray, coordinator, 3) == expected[2:5]


DRIVER = textwrap.dedent(
    """
    import sys, ray
    from distributed_fixtures import runtime_config
    from rl_data.distributed.config import LoaderSpec
    from rl_data.distributed.coordinator import start_data_coordinator

    address, spec, name, lifetime = sys.argv[1:5]
    ray.init(address=address, namespace="rl_data_tests", log_to_driver=False)
    config = runtime_config(1, 0, name=name, lifetime=None if lifetime == "none" else lifetime)
    start_data_coordinator(config, LoaderSpec.model_validate_json(spec))
    print("started", flush=True)
    """
)


@pytest.mark.parametrize("lifetime", ["detached", pytest.param("none", marks=pytest.mark.slow)])
def test_a_detached_coordinator_outlives_the_driver_that_started_it(ray_session, lifetime):
    ray = ray_session
    name = f"rewind_lifetime_{lifetime}"
    address = ray._private.worker.global_worker.node.address
    tests = os.path.dirname(__file__)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, address, SYNTHETIC.model_dump_json(), name, lifetime],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0 and "started" in done.stdout, done.stderr[-3000:]
    if lifetime == "none":  # the driver's exit took its coordinator (and rank actors) with it
        def gone() -> bool:
            try:
                get_coordinator(name, "rl_data_tests")
            except CoordinatorNotFoundError:
                return True
            return False

        wait_for(gone, "the non-detached coordinator to die with its driver")
        return
    handle = get_coordinator(name, "rl_data_tests")
    try:
        client = CoordinatorClient(handle, timeout_s=TIMEOUT_S)
        step, refs = client.next_step()
        assert step == 1
        assert [list(b["source_ids"]) for b in ray.get(refs, timeout=TIMEOUT_S)] == synthetic_reference_stream(
            SYNTHETIC, runtime_config(1, 0), 1
        )[0]
    finally:
        ray.get(handle.shutdown.remote(), timeout=TIMEOUT_S)  # the clean-up rule: shutdown, then kill
        ray.kill(handle, no_restart=True)
        wait_until_name_is_free(name, "rl_data_tests", TIMEOUT_S)
