"""The GRPO demo's stand-in policy: deterministic, several-fold latencies, answers a real verifier scores."""

from __future__ import annotations

from rl_data.jobs.grpo.policy import LATENCY_SPREAD, StandInPolicy
from rl_data.rewards import math_reward

KEYS = [f"prompt-{i:03d}" for i in range(200)]


def test_responses_are_a_function_of_seed_and_prompt():
    policy = StandInPolicy(seed=3, group_size=4)
    assert policy.responses("k", "18") == StandInPolicy(seed=3, group_size=4).responses("k", "18")
    assert len(policy.responses("k", "18")) == 4
    others = [StandInPolicy(seed=s).responses(key, "18") for s in (3, 4) for key in KEYS[:20]]
    assert len({tuple(r) for r in others}) > 30  # prompts and seeds differ


def test_rewards_follow_the_per_prompt_probability_and_some_groups_are_uniform():
    policy = StandInPolicy(seed=0, group_size=4)
    uniform = 0
    for key in KEYS:
        rewards = [math_reward(r, "42") for r in policy.responses(key, "42")]
        assert set(rewards) <= {0.0, 1.0}
        uniform += len(set(rewards)) == 1
        if policy.correct_probability(key) < 0.05:
            assert sum(rewards) <= 1
    # p uniform in [0, 1]: P(all 4 equal) = 2/5 on average
    assert 0.25 * len(KEYS) < uniform < 0.55 * len(KEYS)


def test_wrong_answers_are_wrong_for_a_real_verifier():
    policy = StandInPolicy(seed=1, group_size=8)
    for key in KEYS[:30]:
        for response in policy.responses(key, "7"):
            correct = response.endswith("#### 7")
            assert math_reward(response, "7") == (1.0 if correct else 0.0)


def test_latency_varies_several_fold_between_prompts_and_a_group_waits_for_its_slowest():
    policy = StandInPolicy(seed=0, group_size=4, latency_s=0.01)
    groups = [policy.group_latency_s(key) for key in KEYS]
    assert max(groups) / min(groups) > 4
    assert all(0.01 <= g <= 0.01 * LATENCY_SPREAD * 2 for g in groups)
    key = KEYS[0]
    assert policy.group_latency_s(key) == max(policy.rollout_latency_s(key, i) for i in range(4))
