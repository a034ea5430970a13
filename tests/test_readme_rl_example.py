"""The README's RL prompt example runs as written: raw rows -> rl_prompt dataset -> DatumSpec batches."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from distributed_fixtures import TIMEOUT_S

from rl_data.distributed.client import wait_until_name_is_free

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    """The code between ``# rl-example-start`` and ``# rl-example-end`` in README.md."""
    match = re.search(r"# rl-example-start\n(.*?)# rl-example-end", README.read_text(encoding="utf-8"), re.S)
    assert match, "README.md lost its RL prompt example markers"
    return match.group(1)


@pytest.mark.timeout(600)
def test_the_readme_rl_example_yields_datum_spec_batches(ray_session, tmp_path):
    import ray

    namespace = {"work": str(tmp_path)}
    try:
        exec(compile(readme_example(), str(README), "exec"), namespace)  # noqa: S102 - our own README
    finally:
        handle = ray.get_actor("rl_prompts", namespace="rl_example")
        ray.get(handle.shutdown.remote(), timeout=TIMEOUT_S)
        ray.kill(handle, no_restart=True)
        wait_until_name_is_free("rl_prompts", "rl_example", TIMEOUT_S)
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
