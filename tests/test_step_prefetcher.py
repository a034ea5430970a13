"""``StepPrefetcher``: the next step in hand, commits only of trained steps, exact resume.

The tests share one coordinator (2 ranks, prefetch 1: ``shared_train_coordinator``), rewound to
step 0 at each test's start."""

from __future__ import annotations

import time

import pytest

from distributed_fixtures import TIMEOUT_S, cached_reference_stream, consume, shared_train_coordinator
from rl_data.distributed.step_prefetcher import StepPrefetcher


def source_ids(batches):
    return [list(batch["source_ids"]) for batch in batches]


def committed_step(ray, coordinator):
    return ray.get(coordinator.status.remote(), timeout=TIMEOUT_S)["committed_step"]


@pytest.fixture(scope="module")
def shared_coordinator(ray_session, energon_dataset):
    yield from shared_train_coordinator(ray_session, energon_dataset, "prefetched_feed")


@pytest.fixture
def coordinator(shared_coordinator):
    """The shared coordinator rewound to its start: step 0, nothing pending."""
    return shared_coordinator.reset()


@pytest.mark.timeout(240)
def test_prefetched_steps_follow_the_stream_commit_only_trained_steps_and_resume_exactly(
    ray_session, shared_coordinator, coordinator, tokenizer
):
    ray = ray_session
    expected = cached_reference_stream(shared_coordinator.spec, shared_coordinator.config, tokenizer, 7, read_at_least=7)
    with StepPrefetcher(coordinator, transform=source_ids, timeout_s=TIMEOUT_S) as steps:
        taken = [next(steps) for _ in range(3)]  # step 3 is being trained, 1 and 2 are done
        assert taken == [(k + 1, expected[k]) for k in range(3)]
        deadline = time.monotonic() + 10
        while committed_step(ray, coordinator) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # long enough for a wrong commit of step 3 to land
        assert committed_step(ray, coordinator) == 2  # piggybacked on a request, never step 3
        assert steps.commit_trained() == 3
        state = ray.get(coordinator.state_dict.remote(), timeout=TIMEOUT_S)
        assert state["step"] == 3
        assert [next(steps) for _ in range(2)] == [(4, expected[3]), (5, expected[4])]
    # the trainer resumes from that state (steps 4 and 5 handed out since are dropped: a rewind)
    ray.get(coordinator.load_state_dict.remote(state), timeout=TIMEOUT_S)
    assert consume(ray, coordinator, 4) == expected[3:7]  # nothing skipped, nothing repeated


@pytest.mark.timeout(240)
def test_refs_without_fetching_and_a_failing_transform_reaches_the_trainer(
    ray_session, shared_coordinator, coordinator, tokenizer
):
    ray = ray_session
    expected = cached_reference_stream(shared_coordinator.spec, shared_coordinator.config, tokenizer, 2, read_at_least=7)
    with StepPrefetcher(coordinator, fetch=False, timeout_s=TIMEOUT_S) as steps:
        step, refs = next(steps)
        assert step == 1 and source_ids(ray.get(refs, timeout=TIMEOUT_S)) == expected[0]

    def broken(batches):
        raise ValueError(f"cannot pad {len(batches)} batch(es)")

    steps = StepPrefetcher(coordinator, transform=broken, timeout_s=TIMEOUT_S)
    with pytest.raises(ValueError, match=r"cannot pad 2 batch\(es\)"):
        next(steps)
    with pytest.raises(StopIteration):
        next(steps)
