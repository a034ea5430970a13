"""Async RL quickstart: prompts -> the prompt feed -> rollouts, rewards, ack or drop."""

import random
import tempfile
from pathlib import Path

import ray

from rl_data import (FeedConfig, LoaderSpec, ParallelLayout, PreprocessConfig,
                     RuntimeConfig, attach_feed, math_reward, run_preprocess,
                     start_prompt_feed, write_gsm8k_rows)

work = Path(tempfile.mkdtemp())
write_gsm8k_rows(work / "gsm8k.jsonl", 40)  # or your own GSM8K-style rows
run_preprocess(PreprocessConfig(inputs=[f"{work}/gsm8k.jsonl"], output=f"{work}/prompts",
                                task="rl_prompt", splits={"train": 1.0}, progress=False))
spec = LoaderSpec(source={"path": f"{work}/prompts", "split": "train"},
                  data_config={"energon": {"task": "rl_prompt"}, "shuffle": True},
                  batch_size=4, max_sequence_length=512)
config = RuntimeConfig(parallel_layout=ParallelLayout(dp=2),
                       bundle_resources={"CPU": 0.25}, rank_actor_num_cpus=0.25)
feed = start_prompt_feed(config, spec, FeedConfig(max_outstanding=64))  # keep the handle
rollout, trainer = attach_feed(holder="worker-0")  # from any process of the cluster
for step in range(1, 4):
    trained, uniform = [], []
    for prompt in rollout.take(8):  # TakenPrompt(uid, key, payload: a DatumSpec row)
        truth = prompt.payload["extra_env_info"]["ground_truth"]
        group = [random.choice([truth, "0"]) for _ in range(4)]  # stand-in policy
        rewards = [math_reward(f"#### {answer}", truth) for answer in group]
        (uniform if len(set(rewards)) == 1 else trained).append(prompt.uid)
    trainer.drop(uniform, "uniform_reward")  # no learning signal: not handed out again
    trainer.ack(trained)  # after the training step that used them
    print(f"step {step}: trained {len(trained)} prompts, dropped {len(uniform)}")
print("data checkpoint:", trainer.save_checkpoint(f"{work}/data_checkpoint"))
print("feed totals:", trainer.status()["totals"])
ray.shutdown()
