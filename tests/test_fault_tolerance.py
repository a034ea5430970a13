"""Faults: killed rank actors are replaced without changing the stream; stalls and repeated deaths fail clearly."""

from __future__ import annotations

import pytest

from distributed_fixtures import TIMEOUT_S, consume, reference_stream, running_coordinator, runtime_config, train_spec
from rl_data.distributed.coordinator import RankFailedError, RankTimeoutError


def _kill_rank(ray, coordinator, rank: int, namespace: str = "rl_data_tests") -> None:
    name = ray.get(coordinator.status.remote(), timeout=TIMEOUT_S)["rank_actor_names"][rank]
    ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)


def _ids(ray, refs):
    return [list(b["source_ids"]) for b in ray.get(refs, timeout=TIMEOUT_S)]


def test_killed_rank_actors_are_replaced_and_the_stream_is_unchanged(ray_session, energon_dataset, tokenizer, tmp_path):
    ray = ray_session
    spec, config = train_spec(energon_dataset), runtime_config(2, 2)
    expected = reference_stream(spec, config, tokenizer, 10)
    with running_coordinator(ray, config, spec) as coordinator:
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
        status = ray.get(coordinator.status.remote(), timeout=TIMEOUT_S)
        assert (status["committed_step"], status["restarts"]) == (10, [2, 1])
        assert [name.split(".", 2)[2] for name in status["rank_actor_names"]] == ["rank0.2", "rank1.1"]


def test_stalled_rank_times_out_naming_it_and_a_retry_does_not_skip(ray_session, energon_dataset, tokenizer):
    ray = ray_session
    spec = train_spec(energon_dataset)
    config = runtime_config(2, 0, step_timeout_s=1.0, injected_delay_s={1: 4.0})
    expected = reference_stream(spec, config, tokenizer, 1)
    with running_coordinator(ray, config, spec) as coordinator:
        with pytest.raises(
            RankTimeoutError,
            match=r"rank 1 did not finish producing the batch for step 1 within 1 s \(it has been producing batch 0 for [0-9.]+ s; produced 0 batches, 0 ready, pid \d+\); raise step_timeout_s",
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


def test_a_rank_that_dies_more_often_than_allowed_fails_clearly(ray_session, energon_dataset):
    ray = ray_session
    config = runtime_config(1, 1, max_rank_restarts=0)
    with running_coordinator(ray, config, train_spec(energon_dataset)) as coordinator:
        consume(ray, coordinator, 1)
        _kill_rank(ray, coordinator, 0)
        with pytest.raises(RankFailedError, match=r"rank 0 died 1 times, more than max_rank_restarts=0; last cause: "):
            ray.get(coordinator.next_step.remote(), timeout=TIMEOUT_S)
