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


def chaos_config(tmp_path, **options) -> GRPODemoConfig:
    """48 prompts, 2 workers, 2 -> 1 DP ranks, a worker killed after step 2 and everything after step 7."""
    return GRPODemoConfig(
        work_dir=str(tmp_path / "work"), num_prompts=48, workers=2, groups_per_step=3, dp=2, resume_dp=1,
        checkpoint_every=3, kill_worker_at_step=2, kill_all_at_step=7, failure_rate=0.1,
        namespace=NAMESPACE, progress=False, timeout_s=TIMEOUT_S, **options,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_demo_resolves_every_prompt_of_every_epoch_exactly_once_through_chaos(ray_session, tmp_path):
    from rl_data.jobs.grpo.demo import run_grpo_demo

    config = chaos_config(tmp_path, epochs=2, feed_name="grpo-test-feed")
    out = io.StringIO()
    summary = run_grpo_demo(config, Console(file=out, width=200))
    text = out.getvalue()
    assert summary.passed, text
    assert [a.epoch for a in summary.accounts] == [0, 1]
    for account in summary.accounts:
        assert account.expected == 48 and account.trained + sum(account.dropped.values()) == 48
        assert account.duplicates == account.missing == 0 and account.feed_agrees
        assert set(account.dropped) <= {"uniform_reward"}
    assert sum(a.dropped.get("uniform_reward", 0) for a in summary.accounts) > 0  # dynamic sampling happened
    c = summary.counters
    # the chaos happened and its prompts came back: killed worker, failed generations, rolled-back steps
    assert any("died: released its" in e for e in c.events)
    assert any("killed every actor; restored step 6 on 1 DP trainer rank(s)" in e for e in c.events)  # 2 -> 1 ranks
    assert c.failed > 0 and c.regenerated > 0 and c.rolled_back > 0
    assert c.feed_totals["released"] >= c.failed + c.released_by_supervisor
    assert summary.final_step >= 7
    assert "PASS: 2 epochs x 48 prompts: 0 duplicated, 0 missing" in " ".join(text.split())
    assert "prompt accounting per epoch" in text


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_demo_with_a_difficulty_filter_accounts_every_skipped_prompt_by_key_through_chaos(ray_session, tmp_path):
    """Skipped prompts are never handed out: each epoch's unresolved keys must be exactly the skipped
    ones (count and digest), through a worker kill and a kill-everything restore."""
    from rl_data.jobs.grpo.demo import run_grpo_demo
    from rl_data.prompt_feed.schedules import ScheduleConfig

    schedule = ScheduleConfig(name="difficulty_filter", options={"retire_after": 1, "defer_after": 1})
    config = chaos_config(tmp_path, epochs=3, feed_name="grpo-test-feed-scheduled", schedule=schedule)
    out = io.StringIO()
    summary = run_grpo_demo(config, Console(file=out, width=220))
    text = out.getvalue()
    assert summary.passed, text
    first, *later = summary.accounts
    assert first.skipped == {} and first.trained + sum(first.dropped.values()) == 48  # no history yet
    for account in later:
        skipped = sum(account.skipped.values())
        assert skipped > 0 and set(account.skipped) <= {"retired", "deferred"}, account
        assert account.trained + sum(account.dropped.values()) + skipped == 48 and account.missing == 0
    assert summary.counters.rolled_back > 0  # the restore rolled the schedule's history back with the feed
    wasted = [sum(a.dropped.values()) / (a.trained + sum(a.dropped.values())) for a in summary.accounts]
    assert wasted[2] < wasted[0], wasted  # fewer zero-spread groups once solved and failed prompts sit out


def test_the_demo_config_refuses_a_bad_schedule_early(tmp_path):
    from rl_data.prompt_feed.schedules import ScheduleConfig

    with pytest.raises(ValueError, match=r"schedule 'fancy' is not built in"):
        GRPODemoConfig(work_dir=str(tmp_path), schedule=ScheduleConfig(name="fancy"))
    with pytest.raises(ValueError, match=r"schedule 'difficulty_filter' runs over passes"):
        GRPODemoConfig(work_dir=str(tmp_path), mixture={"a": 1.0, "b": 1.0}, schedule=ScheduleConfig(name="difficulty_filter"))


@pytest.mark.timeout(300)
def test_a_data_parallel_step_equals_the_single_rank_step(ray_session):
    import torch

    from rl_data.jobs.grpo.actors import PolicyTrainer
    from rl_data.jobs.grpo.demo import train_data_parallel
    from rl_data.jobs.grpo.policy import StandInPolicy
    from rl_data.tokenization.tokenizer import load_qwen3_tokenizer

    ray = ray_session
    policy = StandInPolicy(seed=1, group_size=4)
    groups = [{"uid": (0, i), "prompt_ids": [11, 12, 13 + i], "responses": policy.responses(f"k{i}", "7"),
               "rewards": [float(r.endswith("#### 7")) for r in policy.responses(f"k{i}", "7")]} for i in range(5)]
    trainer = ray.remote(PolicyTrainer).options(num_cpus=0)
    first, second = trainer.remote(load_qwen3_tokenizer, 0), trainer.remote(load_qwen3_tokenizer, 0)
    initial = ray.get(first.state_dict.remote(), timeout=TIMEOUT_S)
    one = train_data_parallel([first], groups, TIMEOUT_S)
    single = ray.get(first.state_dict.remote(), timeout=TIMEOUT_S)
    ray.get(first.load_state_dict.remote(initial), timeout=TIMEOUT_S)  # back to the start: a rank of the pair
    assert not torch.equal(single["head"]["weight"], initial["head"]["weight"])  # the step changed the model
    two = train_data_parallel([first, second], groups, TIMEOUT_S)  # groups 0, 2, 4 on rank 0; 1, 3 on rank 1
    assert one["tokens"] == two["tokens"] and abs(one["loss"] - two["loss"]) < 1e-6
    weights = [single, *ray.get([t.state_dict.remote() for t in (first, second)], timeout=TIMEOUT_S)]
    for name in ("embed", "head"):
        for key, value in weights[0][name].items():
            assert torch.allclose(value, weights[1][name][key], atol=1e-6) and torch.equal(weights[1][name][key], weights[2][name][key])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_demo_on_a_mixture_resolves_the_first_prompts_of_its_endless_epoch_exactly_once(ray_session, tmp_path):
    from rl_data.jobs.grpo.demo import run_grpo_demo

    # one rollout worker, none killed (the chaos test above runs 2 and kills one): here the mixture's feed restores
    config = GRPODemoConfig(
        work_dir=str(tmp_path / "work"), num_prompts=40, mixture={"easy": 0.7, "hard": 0.3}, prompts=60, workers=1,
        groups_per_step=3, checkpoint_every=3, kill_worker_at_step=None, kill_all_at_step=5, dp=1, resume_dp=2,
        namespace=NAMESPACE, feed_name="grpo-mixture-feed", progress=False, timeout_s=TIMEOUT_S,
    )  # fmt: skip
    assert config.loader_spec().source.epoch_mode == "virtual" and config.prompt_target == 60
    out = io.StringIO()
    summary = run_grpo_demo(config, Console(file=out, width=200))
    text = " ".join(out.getvalue().split())
    assert summary.passed, out.getvalue()
    [account] = summary.accounts
    assert (account.epoch, account.expected, account.duplicates, account.missing, account.unexpected) == (0, 60, 0, 0, 0)
    assert "PASS: the first 60 prompts of the mixture's endless epoch: 0 duplicated, 0 missing" in text
    counts = summary.mixture_counts
    assert set(counts) == {"easy", "hard"} and counts["easy"] > counts["hard"]  # 70 / 30 by weight
    assert "killed every actor; restored step 3 on 2 DP trainer rank(s)" in text
    with pytest.raises(ValueError, match="a mixture is made of the generated prompts"):
        GRPODemoConfig(work_dir=str(tmp_path), data="/d", mixture={"a": 1.0})
