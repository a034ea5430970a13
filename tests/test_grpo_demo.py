"""The GRPO demo job end to end on the session's Ray: async rollouts, chaos, three-way accounting."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from distributed_fixtures import TIMEOUT_S
from rl_data.jobs.grpo.config import GRPODemoConfig

NAMESPACE = "rl_data_grpo_tests"


def test_config_refuses_partial_batches_and_a_kill_before_the_first_checkpoint(tmp_path):
    with pytest.raises(ValueError, match=r"num_prompts 50 is not a multiple of ranks x batch_size = 8; .* use 48"):
        GRPODemoConfig(work_dir=str(tmp_path), num_prompts=50)
    with pytest.raises(ValueError, match=r"kill_all_at_step 3 comes before the first checkpoint \(step 3\)"):
        GRPODemoConfig(work_dir=str(tmp_path), kill_all_at_step=3)
    with pytest.raises(ValueError, match="Extra inputs"):
        GRPODemoConfig(work_dir=str(tmp_path), workerz=2)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_demo_resolves_every_prompt_of_every_epoch_exactly_once_through_chaos(ray_session, tmp_path):
    from rl_data.jobs.grpo.demo import run_grpo_demo

    config = GRPODemoConfig(
        work_dir=str(tmp_path / "work"), num_prompts=48, epochs=3, workers=3, groups_per_step=3,
        checkpoint_every=3, kill_worker_at_step=2, kill_all_at_step=7, failure_rate=0.1,
        namespace=NAMESPACE, feed_name="grpo-test-feed", progress=False, timeout_s=TIMEOUT_S,
    )  # fmt: skip
    out = io.StringIO()
    summary = run_grpo_demo(config, Console(file=out, width=200))
    text = out.getvalue()
    assert summary.passed, text
    assert [a.epoch for a in summary.accounts] == [0, 1, 2]
    for account in summary.accounts:
        assert account.expected == 48 and account.trained + sum(account.dropped.values()) == 48
        assert account.duplicates == account.missing == 0 and account.feed_agrees
        assert set(account.dropped) <= {"uniform_reward"}
    assert sum(a.dropped.get("uniform_reward", 0) for a in summary.accounts) > 0  # dynamic sampling happened
    c = summary.counters
    # the chaos happened and its prompts came back: killed worker, failed generations, rolled-back steps
    assert any("died: released its" in e for e in c.events) and any("killed every actor" in e for e in c.events)
    assert c.failed > 0 and c.regenerated > 0 and c.rolled_back > 0
    assert c.feed_totals["released"] >= c.failed + c.released_by_supervisor
    assert summary.final_step >= 7
    assert "PASS: 3 epochs x 48 prompts: 0 duplicated, 0 missing" in " ".join(text.split())
    assert "prompt accounting per epoch" in text
