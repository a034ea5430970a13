"""The README's TRL example runs as written: GSM8K rows -> rl_prompt dataset -> prompt feed -> GRPOTrainer."""

from __future__ import annotations

import pytest
from distributed_fixtures import TIMEOUT_S
from readme_examples import ran_readme_example


@pytest.mark.slow  # the README examples run as written in CI (--run-slow); their paths are the default run's other tests
@pytest.mark.timeout(600)
def test_the_readme_trl_example_trains_on_the_feed_and_checkpoints_it(ray_session, tmp_path):
    import ray

    from rl_data.integrations.trl import FEED_FOLDER

    with ran_readme_example("trl-example", tmp_path, "trl_prompts", "trl_example") as namespace:
        status = ray.get(namespace["feed"].status.remote(), timeout=TIMEOUT_S)
    assert namespace["trainer"].state.global_step == 4
    assert (status["totals"]["acked"], status["outstanding"]) == (8, 0)  # 2 prompts a step; prefetched ones released
    for step in (2, 4):
        assert (tmp_path / "grpo" / f"checkpoint-{step}" / FEED_FOLDER / "trl_callback.json").is_file()
