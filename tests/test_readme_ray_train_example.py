"""The README's Ray Train example runs as written: a TorchTrainer whose workers take their batches
from the coordinator and whose checkpoints carry the data state."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from distributed_fixtures import TIMEOUT_S
from readme_examples import ran_readme_example

from rl_data.distributed.checkpoint_files import checkpoint_path, load_checkpoint_file


@pytest.mark.slow  # the README examples run as written in CI (--run-slow); their paths are the default run's other tests
@pytest.mark.timeout(600)
def test_the_readme_ray_train_example_trains_and_checkpoints_the_data(ray_session, tmp_path):
    import ray

    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "300")  # 60 s is tight on a loaded 2-core VM
    with ran_readme_example("ray-train-example", tmp_path, "sft_data", "train_example") as namespace:
        progress = ray.get(namespace["coordinator"].progress.remote(), timeout=TIMEOUT_S)
    result = namespace["result"]
    assert result.error is None and result.metrics["loss"] > 0
    assert progress["committed_step"] == 10 and progress["rewinds"] == 0
    with result.checkpoint.as_directory() as directory:
        state = load_checkpoint_file(checkpoint_path(directory))
        model = torch.load(Path(directory) / "model.pt", weights_only=True)
    assert state["step"] == 10 and len(state["ranks"]) == 2 and model["weight"].shape == (151_936, 16)
