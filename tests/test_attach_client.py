"""Attaching to a running coordinator from another driver (an RL loop) with ``attach``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from distributed_fixtures import TIMEOUT_S, consume, reference_stream, running_coordinator, runtime_config, train_spec
from rl_data.distributed import CoordinatorClient, CoordinatorNotFoundError, attach

_RL_LOOP = textwrap.dedent(
    """
    import json, sys
    from rl_data.distributed import CoordinatorNotFoundError, attach

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


def test_a_second_driver_attaches_by_name_pulls_and_commits_steps(ray_session, energon_dataset, tokenizer):
    ray = ray_session
    spec, config = train_spec(energon_dataset), runtime_config(2, 1, name="rl_loop_feed")
    expected = reference_stream(spec, config, tokenizer, 3)
    with running_coordinator(ray, config, spec) as coordinator:
        assert consume(ray, coordinator, 1) == expected[:1]
        env = dict(os.environ, RAY_AUTH_MODE="token", PYTHONPATH=str(Path(__file__).parents[1]))
        result = subprocess.run(
            [sys.executable, "-c", _RL_LOOP, ray.get_runtime_context().gcs_address, "rl_loop_feed", "rl_data_tests"],
            capture_output=True, text=True, timeout=120, env=env,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        line = next(l for l in result.stdout.splitlines() if l.startswith("RESULT "))
        report = json.loads(line[len("RESULT "):])
        assert report["steps"] == [[2, expected[1], "BatchedDataDict"], [3, expected[2], "BatchedDataDict"]]
        assert report["committed"] == 3
        assert report["missing"] == (
            "no data coordinator named 'no_such_feed' in Ray namespace 'rl_data_tests'; start one with "
            "rl_data.distributed.start_data_coordinator (RuntimeConfig.name/namespace must match) and "
            "check that its job is still running"
        )
        # The first driver sees the steps the second one committed.
        assert ray.get(coordinator.state_dict.remote(), timeout=TIMEOUT_S)["step"] == 3


def test_attach_in_a_connected_driver_wraps_the_named_handle(ray_session, energon_dataset, tokenizer, tmp_path):
    ray = ray_session
    spec, config = train_spec(energon_dataset), runtime_config(1, 0, name="local_feed")
    expected = reference_stream(spec, config, tokenizer, 2)
    with running_coordinator(ray, config, spec) as coordinator:
        feed = attach("local_feed", "rl_data_tests", timeout_s=TIMEOUT_S)
        assert isinstance(feed, CoordinatorClient) and feed.handle._actor_id == coordinator._actor_id
        step, refs = feed.next_step()
        assert (step, list(feed.fetch(refs[0])["source_ids"])) == (1, expected[0][0])
        feed.commit(step)
        assert feed.state_dict()["step"] == 1
        assert feed.save_checkpoint(str(tmp_path / "ckpt")) == str(tmp_path / "ckpt" / "rl_data_state.pt")
    with pytest.raises(CoordinatorNotFoundError, match=r"no data coordinator named 'local_feed' in Ray namespace 'rl_data_tests'"):
        attach("local_feed", "rl_data_tests")
