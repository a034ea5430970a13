"""Faults: killed rank actors are replaced without changing the stream; stalls and repeated deaths fail clearly.

Starting rank actors (torch, the tokenizer, Energon: ~3 CPU-s each) is most of this module's cost, so
the tests whose subject is the coordinator itself (a stalled rank timing out, a rank dying more often
than allowed, a failed restore refusing steps) run on the synthetic task (:data:`SYNTHETIC_SPEC`: the
same coordinator, rank pool and rank actors over loaders that import no torch, tokenizer or Energon;
their reference is read from the same synthetic loaders). The tests parametrized over Energon workers
stay on Energon; per number of workers they read one reference, and those whose subject is a live
coordinator of 2 ranks share one (:func:`shared`, reset at each test's start: deaths and rewinds are
counted from there). A test that needs a fresh coordinator's restore after running steps rewinds its
coordinator to its origin instead of starting a second one; a new coordinator restoring a checkpoint
is covered by ``test_coordinator.py`` (Energon workers 0 and 2) and ``test_chaos.py``.
"""

from __future__ import annotations

import pytest

from distributed_fixtures import (
    ENERGON_WORKERS_0_SLOW,
    TIMEOUT_S,
    SharedCoordinator,
    consume,
    reference_stream,
    running_coordinator,
    runtime_config,
    synthetic_reference_stream,
    train_spec,
)
from rl_data.distributed.coordinator import RankFailedError, RankTimeoutError
from rl_data.tasks.synthetic import synthetic_loader_spec

#: 3 batches of 2 per pass (7 samples per rank, one dropped per pass): a few steps cross a pass end.
SYNTHETIC_SPEC = synthetic_loader_spec(batch_size=2, samples_per_rank=7, tokens_per_sample=8, name="faults-synthetic")
#: Steps of the Energon reference: the longest test's, across the 5-batch virtual epoch boundary.
REFERENCE_STEPS = 10


@pytest.fixture(scope="module", params=ENERGON_WORKERS_0_SLOW)
def workers(request):
    """Energon loader workers of the Energon tests (pytest runs each value's tests together)."""
    return request.param


@pytest.fixture(scope="module")
def expected(energon_dataset, tokenizer, workers):
    """``[step][rank] -> source ids`` of an uninterrupted run of 2 ranks (any prefetch depth, delay or timeout)."""
    return reference_stream(train_spec(energon_dataset, workers), runtime_config(2, 2), tokenizer, REFERENCE_STEPS)


@pytest.fixture(scope="module")
def shared(ray_session, energon_dataset, workers):
    """A coordinator of 2 ranks, prefetch depth 2, for the tests whose subject is a live one (each
    kill counts against ``max_rank_restarts``, over every test of this module)."""
    config = runtime_config(2, 2, name=f"faults_shared_{workers}", max_rank_restarts=10)
    coordinator = SharedCoordinator(ray_session, config, train_spec(energon_dataset, workers))
    try:
        yield coordinator
    finally:
        coordinator.close()


def _kill_rank(ray, coordinator, rank: int, namespace: str = "rl_data_tests") -> None:
    name = ray.get(coordinator.status.remote(), timeout=TIMEOUT_S)["rank_actor_names"][rank]
    ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)


def _ids(ray, refs):
    return [list(b["source_ids"]) for b in ray.get(refs, timeout=TIMEOUT_S)]


def _status(ray, coordinator) -> dict:
    return ray.get(coordinator.status.remote(), timeout=TIMEOUT_S)


def _deaths_since(before: dict, status: dict) -> list[int]:
    """Rank deaths per rank between two statuses of one coordinator."""
    return [after - earlier for after, earlier in zip(status["restarts"], before["restarts"], strict=True)]


def _back_to_a_fresh_start(ray, coordinator) -> None:
    """Rewind ``coordinator`` to its origin: nothing pending or prefetched, every rank on a new loader
    not yet iterated, as in a fresh coordinator. The next restore is then a fresh coordinator's (not a
    rewind: ``rewinds`` stays 1), without starting a second coordinator and its rank actors."""
    origin = ray.get(coordinator.origin_state_dict.remote(), timeout=TIMEOUT_S)
    ray.get(coordinator.load_state_dict.remote(origin), timeout=TIMEOUT_S)
    assert ray.get(coordinator.progress.remote(), timeout=TIMEOUT_S)["rewinds"] == 1


@pytest.mark.timeout(300)
def test_killed_rank_actors_are_replaced_and_the_stream_is_unchanged(ray_session, shared, expected, tmp_path):
    ray = ray_session
    coordinator = shared.reset()
    before = _status(ray, coordinator)
    consumed = consume(ray, coordinator, 2)

    # Right after a checkpoint (rank 0 has prefetched batches in flight).
    ray.get(coordinator.save_checkpoint.remote(str(tmp_path / "ckpt")), timeout=TIMEOUT_S)
    _kill_rank(ray, coordinator, 0)
    consumed += consume(ray, coordinator, 2)

    # With steps 5 and 6 handed out but not committed: the replacement of rank 1 re-produces
    # them, and the batches the trainer already holds survive their producer's death.
    held = [ray.get(coordinator.next_step.remote(), timeout=TIMEOUT_S) for _ in range(2)]
    _kill_rank(ray, coordinator, 1)
    consumed += [_ids(ray, refs) for _, refs in held]
    step, refs = ray.get(coordinator.next_step.remote(), timeout=TIMEOUT_S)
    assert [s for s, _ in held] + [step] == [5, 6, 7]
    consumed.append(_ids(ray, refs))
    ray.get(coordinator.commit.remote(step), timeout=TIMEOUT_S)

    # While the batch for step 8 is being produced.
    pending_step = coordinator.next_step.remote()
    _kill_rank(ray, coordinator, 0)
    step, refs = ray.get(pending_step, timeout=TIMEOUT_S)
    consumed.append(_ids(ray, refs))
    ray.get(coordinator.commit.remote(step), timeout=TIMEOUT_S)
    consumed += consume(ray, coordinator, 2)

    assert consumed == expected
    status = _status(ray, coordinator)
    assert (status["committed_step"], _deaths_since(before, status)) == (10, [2, 1])
    # every replacement has a name of its own: <coordinator>.<instance>.rank<r>.<deaths of rank r>
    names = [name.split(".", 2)[2] for name in status["rank_actor_names"]]
    assert names == [f"rank{r}.{deaths}" for r, deaths in enumerate(status["restarts"])]


@pytest.mark.timeout(180)
def test_stalled_rank_times_out_naming_it_and_a_retry_does_not_skip(ray_session):
    """On the synthetic task (the subject is the coordinator's step timeout and its kept requests);
    :func:`test_a_replacement_that_times_out_is_finished_before_its_rank_serves_again` retries
    timed-out steps while a replacement catches up."""
    ray = ray_session
    config = runtime_config(2, 0, step_timeout_s=2.0, injected_delay_s={1: 6.0})
    expected = synthetic_reference_stream(SYNTHETIC_SPEC, config, 1)
    with running_coordinator(ray, config, SYNTHETIC_SPEC) as coordinator:
        with pytest.raises(  # the step's limit, not the last short wait that names the late rank
            RankTimeoutError,
            match=r"rank 1 did not finish producing the batch for step 1 within 2 s \(it has been producing batch 0 for [0-9.]+ s; produced 0 batches, 0 ready, pid \d+\); raise step_timeout_s",
        ):
            ray.get(coordinator.next_step.remote(), timeout=TIMEOUT_S)
        # The outstanding requests are kept: retrying yields step 1, for both ranks, once.
        for _ in range(10):
            try:
                step, refs = ray.get(coordinator.next_step.remote(), timeout=TIMEOUT_S)
                break
            except RankTimeoutError:
                continue
        assert (step, _ids(ray, refs)) == (1, expected[0])


@pytest.mark.timeout(180)
def test_a_rank_that_dies_more_often_than_allowed_fails_clearly(ray_session):
    """On the synthetic task (the subject is the coordinator's count of rank deaths)."""
    ray = ray_session
    config = runtime_config(1, 1, max_rank_restarts=0)
    expected = synthetic_reference_stream(SYNTHETIC_SPEC, config, 1)
    with running_coordinator(ray, config, SYNTHETIC_SPEC) as coordinator:
        assert consume(ray, coordinator, 1) == expected
        _kill_rank(ray, coordinator, 0)
        with pytest.raises(RankFailedError, match=r"rank 0 died 1 times, more than max_rank_restarts=0; last cause \(while serving steps\): "):
            ray.get(coordinator.next_step.remote(), timeout=TIMEOUT_S)


def _next_step_retrying(ray, coordinator, tries: int = 30, **kwargs):
    """``next_step`` repeated while a rank times out (the coordinator keeps its requests)."""
    for _ in range(tries - 1):
        try:
            return ray.get(coordinator.next_step.remote(**kwargs), timeout=TIMEOUT_S)
        except RankTimeoutError:
            continue
    return ray.get(coordinator.next_step.remote(**kwargs), timeout=TIMEOUT_S)


@pytest.mark.timeout(240)
def test_a_replacement_that_times_out_is_finished_before_its_rank_serves_again(ray_session):
    """Issue 12 item 2: rank 1 needs 1.5 s a batch, the step timeout is 1 s. Killed with steps 2
    and 3 pending, its replacement times out re-producing step 2; the retries must finish the
    re-production (never hand out a batch of an actor that has not caught up). On the synthetic
    task: the subject is the coordinator's retries; a replacement re-producing Energon batches (with
    workers) is :func:`test_killed_rank_actors_are_replaced_and_the_stream_is_unchanged`'s."""
    ray = ray_session
    config = runtime_config(2, 2, step_timeout_s=1.0, injected_delay_s={1: 1.5})
    expected = synthetic_reference_stream(SYNTHETIC_SPEC, config, 6)
    with running_coordinator(ray, config, SYNTHETIC_SPEC) as coordinator:
        taken = [_next_step_retrying(ray, coordinator) for _ in range(3)]
        ray.get(coordinator.commit.remote(1), timeout=TIMEOUT_S)
        _kill_rank(ray, coordinator, 1)
        with pytest.raises(RankTimeoutError, match=r"rank 1 did not finish re-producing the batch for step 2 within 1 s"):
            ray.get(coordinator.next_step.remote(), timeout=TIMEOUT_S)
        taken += [_next_step_retrying(ray, coordinator) for _ in range(3)]
        assert [step for step, _ in taken] == [1, 2, 3, 4, 5, 6]
        # Steps 2 and 3 were re-produced by the replacement: fresh refs, the same samples.
        assert [_ids(ray, refs) for _, refs in taken] == expected[:6]
        redelivered = [ray.get(coordinator.redeliver.remote(step), timeout=TIMEOUT_S) for step in (2, 3)]
        assert [_ids(ray, refs) for refs in redelivered] == expected[1:3]
        status = _status(ray, coordinator)
        assert (status["restarts"], status["recovering_ranks"]) == ([0, 1], [])


@pytest.mark.timeout(240)
def test_a_rank_that_died_before_a_restore_is_replaced_and_restored(ray_session, shared, expected, tmp_path):
    # Issue 12 item 3: the restore used to fail with a bare ActorDiedError, and the next steps
    # mixed restored ranks with a fresh one.
    ray = ray_session
    coordinator = shared.reset()
    assert consume(ray, coordinator, 2) == expected[:2]
    ray.get(coordinator.save_checkpoint.remote(str(tmp_path)), timeout=TIMEOUT_S)
    coordinator = shared.reset()  # back to its origin, nothing produced since: the next restore is a fresh coordinator's
    before = _status(ray, coordinator)
    _kill_rank(ray, coordinator, 1)
    assert ray.get(coordinator.load_checkpoint.remote(str(tmp_path)), timeout=TIMEOUT_S) == 2
    assert consume(ray, coordinator, 3) == expected[2:5]
    status = _status(ray, coordinator)
    assert _deaths_since(before, status) == [0, 1]
    assert status["rewinds"] == before["rewinds"]  # the checkpoint's restore was no rewind


@pytest.mark.timeout(180)
def test_a_failed_restore_refuses_every_step_until_a_restore_succeeds(ray_session):
    """On the synthetic task (the subject is the coordinator's all-or-nothing restore), its restores
    those of a fresh coordinator (:func:`_back_to_a_fresh_start`)."""
    ray = ray_session
    config = runtime_config(2, 1)
    expected = synthetic_reference_stream(SYNTHETIC_SPEC, config, 4)
    with running_coordinator(ray, config, SYNTHETIC_SPEC) as coordinator:
        assert consume(ray, coordinator, 2) == expected[:2]
        good = ray.get(coordinator.state_dict.remote(), timeout=TIMEOUT_S)
        damaged = {**good, "ranks": [good["ranks"][0], {**good["ranks"][1], "position": "damaged"}]}
        _back_to_a_fresh_start(ray, coordinator)
        # Rank 0 restores, rank 1 refuses its state: the coordinator is half restored.
        with pytest.raises(RankFailedError, match=r"rank 1 failed while restoring its checkpoint state: "):
            ray.get(coordinator.load_state_dict.remote(damaged), timeout=TIMEOUT_S)
        refusal = (
            r"refusing {call}: restoring the checkpoint of step 2 failed: rank 1 failed while restoring its "
            r"checkpoint state: .*; call load_checkpoint/load_state_dict again until it succeeds"
        )
        with pytest.raises(RuntimeError, match=refusal.format(call="next_step")) as refused:
            ray.get(coordinator.next_step.remote(), timeout=TIMEOUT_S)
        from rl_data.distributed.coordinator import RestoreIncompleteError

        assert isinstance(refused.value, RestoreIncompleteError)
        with pytest.raises(RestoreIncompleteError, match=refusal.format(call="state_dict")):
            ray.get(coordinator.state_dict.remote(), timeout=TIMEOUT_S)
        with pytest.raises(RestoreIncompleteError, match=refusal.format(call="commit")):
            ray.get(coordinator.commit.remote(0), timeout=TIMEOUT_S)
        ray.get(coordinator.load_state_dict.remote(good), timeout=TIMEOUT_S)
        assert consume(ray, coordinator, 2) == expected[2:]
        assert ray.get(coordinator.progress.remote(), timeout=TIMEOUT_S)["rewinds"] == 1  # the restores: no rewinds
