"""Attaching to a running coordinator from another driver (an RL loop) with ``attach``.

The subject is the client (attach by name, timeouts, leaving prefetched steps), not what the loaders
read, so every test runs on the synthetic task (:data:`SPEC`: the same coordinator and rank actors
over loaders that import no torch, tokenizer or Energon, a fifth of an Energon rank's start; the
reference is read from the same synthetic loaders). The tests that need no coordinator of their own
share one (:func:`shared_coordinator`), restored at each test's start to where it started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from distributed_fixtures import (
    TIMEOUT_S,
    SharedCoordinator,
    consume,
    ids_of,
    running_coordinator,
    runtime_config,
    synthetic_reference_stream,
    wait_for,
)
from rl_data.distributed.client import CoordinatorClient, CoordinatorNotFoundError, attach
from rl_data.tasks.synthetic import synthetic_loader_spec

#: 3 batches of 2 per pass (7 samples per rank, one dropped per pass): the tests' 6 steps cross pass ends.
SPEC = synthetic_loader_spec(batch_size=2, samples_per_rank=7, tokens_per_sample=8, name="attach-synthetic")
#: The coordinator the tests without special needs share (2 ranks, prefetching 1 batch).
SHARED_CONFIG = runtime_config(2, 1, name="attach_shared")


@pytest.fixture(scope="module")
def _shared(ray_session) -> Iterator[SharedCoordinator]:
    shared = SharedCoordinator(ray_session, SHARED_CONFIG, SPEC)
    yield shared
    shared.close()


@pytest.fixture
def shared_coordinator(ray_session, _shared) -> Any:
    """The module's running coordinator (:data:`SHARED_CONFIG`), restored to its start: step 0,
    nothing handed out, pending or prefetched, as a fresh coordinator. No test kills its rank actors."""
    coordinator = _shared.reset()
    progress = ray_session.get(coordinator.progress.remote(), timeout=TIMEOUT_S)
    assert (progress["committed_step"], progress["handed_step"]) == (0, 0)
    return coordinator


_RL_LOOP = textwrap.dedent(
    """
    import json, sys
    from rl_data import CoordinatorNotFoundError, attach

    address, name, namespace = sys.argv[1:4]
    feed = attach(name, namespace, address, timeout_s=60)
    steps = []
    for _ in range(2):
        step, refs = feed.next_step()
        batches = [feed.fetch(ref, "cpu") for ref in refs]
        steps.append([step, [list(b["source_ids"]) for b in batches], type(batches[0]).__name__])
        feed.commit(step)
    status = feed.status()
    try:
        attach("no_such_feed", namespace, address)
        missing = "attached?!"
    except CoordinatorNotFoundError as error:
        missing = str(error)
    print("RESULT " + json.dumps({"steps": steps, "committed": status["committed_step"], "missing": missing}))
    """
)


@pytest.mark.timeout(180)
def test_a_second_driver_attaches_by_name_pulls_and_commits_steps(ray_session, shared_coordinator):
    ray, coordinator = ray_session, shared_coordinator
    expected = synthetic_reference_stream(SPEC, SHARED_CONFIG, 3)
    assert consume(ray, coordinator, 1) == expected[:1]
    env = dict(os.environ, RAY_AUTH_MODE="token", PYTHONPATH=str(Path(__file__).parents[1]))
    result = subprocess.run(
        [sys.executable, "-c", _RL_LOOP, ray.get_runtime_context().gcs_address, SHARED_CONFIG.name, "rl_data_tests"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(l for l in result.stdout.splitlines() if l.startswith("RESULT "))
    report = json.loads(line[len("RESULT "):])
    assert report["steps"] == [[2, expected[1], "BatchedDataDict"], [3, expected[2], "BatchedDataDict"]]
    assert report["committed"] == 3
    assert report["missing"] == (
        "no data coordinator named 'no_such_feed' in Ray namespace 'rl_data_tests'; start one with "
        "rl_data.start_data_coordinator (RuntimeConfig.name/namespace must match) and "
        "check that its job is still running"
    )
    # The first driver sees the steps the second one committed.
    assert ray.get(coordinator.state_dict.remote(), timeout=TIMEOUT_S)["step"] == 3


@pytest.mark.timeout(180)
def test_attach_in_a_connected_driver_wraps_the_named_handle(ray_session, tmp_path):
    """A coordinator of its own: once it is shut down, its name is not found."""
    ray = ray_session
    config = runtime_config(1, 0, name="local_feed")
    expected = synthetic_reference_stream(SPEC, config, 2)
    with running_coordinator(ray, config, SPEC) as coordinator:
        feed = attach("local_feed", "rl_data_tests", timeout_s=TIMEOUT_S)
        assert isinstance(feed, CoordinatorClient) and feed.handle._actor_id == coordinator._actor_id
        step, refs = feed.next_step()
        assert (step, list(feed.fetch(refs[0])["source_ids"])) == (1, expected[0][0])
        feed.commit(step)
        assert feed.state_dict()["step"] == 1
        assert feed.save_checkpoint(str(tmp_path / "ckpt")) == str(tmp_path / "ckpt" / "rl_data_state.pt")
    with pytest.raises(CoordinatorNotFoundError, match=r"no data coordinator named 'local_feed' in Ray namespace 'rl_data_tests'"):
        attach("local_feed", "rl_data_tests")


def _handed_step(ray, coordinator) -> int:
    return ray.get(coordinator.status.remote(), timeout=TIMEOUT_S)["handed_step"]


@pytest.mark.timeout(180)
def test_a_next_step_that_timed_out_is_answered_with_the_same_step_when_repeated(ray_session):
    """A coordinator of its own: rank 1 takes 2.5 s a batch."""
    # Issue 12 item 4: the repeated call used to return step 2, and commit(2) covered step 1.
    from ray.exceptions import GetTimeoutError

    ray = ray_session
    config = runtime_config(2, 0, name="slow_feed", injected_delay_s={1: 2.5})
    expected = synthetic_reference_stream(SPEC, config, 2)
    with running_coordinator(ray, config, SPEC) as coordinator:
        feed = attach("slow_feed", "rl_data_tests", timeout_s=1.0)
        with pytest.raises(GetTimeoutError):
            feed.next_step()
        wait_for(lambda: _handed_step(ray, coordinator) == 1, "the coordinator to hand out step 1")
        step, refs = feed.next_step()  # re-delivered
        assert (step, ids_of(ray, refs)) == (1, expected[0])
        feed.timeout_s = TIMEOUT_S
        step, refs = feed.next_step()
        assert (step, ids_of(ray, refs)) == (2, expected[1])
        feed.commit(step)


@pytest.mark.timeout(180)
def test_after_leaving_prefetched_steps_early_next_step_returns_the_first_step_not_returned(
    ray_session, shared_coordinator
):
    # Issue 12 item 4: next_step used to return step 6 here, and committing it covered 4 and 5.
    ray, coordinator = ray_session, shared_coordinator
    expected = synthetic_reference_stream(SPEC, SHARED_CONFIG, 6)
    feed = attach(SHARED_CONFIG.name, "rl_data_tests", timeout_s=TIMEOUT_S)
    with feed.prefetched_steps(transform=lambda batches: [list(b["source_ids"]) for b in batches]) as steps:
        assert [next(steps) for _ in range(3)] == [(k + 1, expected[k]) for k in range(3)]
        wait_for(lambda: _handed_step(ray, coordinator) >= 5, "the prefetcher to run two steps ahead")
    step, refs = feed.next_step()
    assert (step, ids_of(ray, refs)) == (4, expected[3])
    feed.commit(step)
    assert feed.pending_steps() == [5]
    assert ids_of(ray, feed.redeliver(5)) == expected[4]  # fresh refs, the same batches
    pending = r"the pending steps are 5..5 and the next new step is 6"
    committed = rf"step 4 is already committed; {pending}; ask for one of those"
    with pytest.raises(ValueError, match=rf"cannot hand out step 4: {committed}"):
        ray.get(feed.handle.next_step.remote(expected_step=4), timeout=TIMEOUT_S)
    with pytest.raises(ValueError, match=rf"cannot hand out step 7: {pending}"):
        ray.get(feed.handle.next_step.remote(expected_step=7), timeout=TIMEOUT_S)
    not_pending = r"the pending steps \(handed out, not committed\) are 5..5; ask next_step for a new step"
    with pytest.raises(ValueError, match=rf"cannot re-deliver step 6: {not_pending}"):
        feed.redeliver(6)
    assert [ids_of(ray, feed.next_step()[1]) for _ in range(2)] == expected[4:6]
    feed.commit(6)
    assert feed.pending_steps() == []
