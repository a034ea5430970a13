"""The README's RL prompt example runs as written: raw rows -> rl_prompt dataset -> DatumSpec batches."""

from __future__ import annotations

import pytest
from readme_examples import ran_readme_example


@pytest.mark.slow  # the README examples run as written in CI (--run-slow); their paths are the default run's other tests
@pytest.mark.timeout(600)
def test_the_readme_rl_example_yields_datum_spec_batches(ray_session, tmp_path):
    with ran_readme_example("rl-example", tmp_path, "rl_prompts", "rl_example") as namespace:
        batch = namespace["batch"]
    assert {"message_log", "length", "extra_env_info", "loss_multiplier", "idx", "task_name", "stop_strings",
            "input_ids", "input_lengths", "source_ids"} == set(batch)
    assert namespace["step"] == 3 and namespace["rewards"] == [1.0] * 8
    prompts, lengths = batch["input_ids"], batch["input_lengths"]
    assert prompts.shape[0] == 8 and int(lengths.max()) == prompts.shape[1]
    import torch

    for row, length, log in zip(prompts, lengths.tolist(), batch["message_log"]):  # left-padded prompts
        assert torch.equal(row[prompts.shape[1] - length:], torch.cat([m["token_ids"] for m in log]))
    assert all(info["ground_truth"].lstrip("-").isdigit() for info in batch["extra_env_info"])
    assert (tmp_path / "data_checkpoint").is_dir()
