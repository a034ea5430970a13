"""Adaptive prompts: outcomes to the feed, a difficulty filter, batches of groups with a reward spread."""

import random
import tempfile
from pathlib import Path

import ray

from rl_data import (DynamicSampler, FeedConfig, LoaderSpec, Outcome, ParallelLayout,
                     PreprocessConfig, RuntimeConfig, ScheduleConfig, attach_feed,
                     math_reward, run_preprocess, start_prompt_feed, write_gsm8k_rows)

work = Path(tempfile.mkdtemp())
write_gsm8k_rows(work / "gsm8k.jsonl", 32)
run_preprocess(PreprocessConfig(inputs=[f"{work}/gsm8k.jsonl"], output=f"{work}/prompts",
                                task="rl_prompt", splits={"train": 1.0}, progress=False))
spec = LoaderSpec(source={"path": f"{work}/prompts", "split": "train"},
                  data_config={"energon": {"task": "rl_prompt"}, "shuffle": True},
                  batch_size=4, max_sequence_length=512)
config = RuntimeConfig(parallel_layout=ParallelLayout(dp=2),
                       bundle_resources={"CPU": 0.25}, rank_actor_num_cpus=0.25)
schedule = ScheduleConfig(name="difficulty_filter",
                          options={"retire_after": 1, "defer_after": 1, "defer_for": 2})
feed = start_prompt_feed(config, spec, FeedConfig(max_outstanding=32, schedule=schedule))
rollout, trainer = attach_feed()


def generate(prompts):
    """Stand-in policy: 4 samples a prompt, right with a chance hidden in the prompt's key."""
    groups = []
    for prompt in prompts:
        truth = prompt.payload["extra_env_info"]["ground_truth"]
        skill = random.Random(prompt.key).choice([0.0, 0.5, 1.0])  # never, sometimes, always right
        answers = [truth if random.random() < skill else "0" for _ in range(4)]
        rewards = [math_reward(f"#### {answer}", truth) for answer in answers]
        groups.append((answers, Outcome.from_rewards(rewards, correct_at=1.0)))
    return groups


sampler = DynamicSampler(rollout, trainer, generate, oversample=1.5)
for step in range(1, 13):
    batch = sampler.next_batch(4)  # 4 groups with a reward spread; zero-spread ones dropped
    ...                            # train on batch.groups
    sampler.ack(batch)             # with their outcomes: the schedule learns from them
    if step % 4 == 0:
        status = trainer.status()
        print(f"step {step}: epoch {status['epoch']}, skipped {status['skipped']}, "
              f"dropped {status['dropped']}")
totals = sampler.totals
print(f"groups kept {totals.kept}, dropped {totals.dropped}, "
      f"samples per useful group {totals.samples_per_useful_group:.1f}")
print("data checkpoint:", trainer.save_checkpoint(f"{work}/data_checkpoint"))
ray.shutdown()
