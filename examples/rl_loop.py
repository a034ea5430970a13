"""An RL loop on the data coordinator: prompt batches, rewards, a checkpoint, a rewind."""

import tempfile
from pathlib import Path

import ray

from rl_data import (LoaderSpec, ParallelLayout, PreprocessConfig, RuntimeConfig, attach,
                     math_reward, run_preprocess, start_data_coordinator,
                     write_gsm8k_rows)

work = Path(tempfile.mkdtemp())
write_gsm8k_rows(work / "gsm8k.jsonl", 200)  # or your own GSM8K-style rows
run_preprocess(PreprocessConfig(inputs=[f"{work}/gsm8k.jsonl"], output=f"{work}/prompts",
                                task="rl_prompt", splits={"train": 1.0}, progress=False))
spec = LoaderSpec(
    source={"path": f"{work}/prompts", "split": "train"},
    data_config={"energon": {"task": "rl_prompt"}, "shuffle": True,
                 "system_prompt": "Solve the problem. End with '#### <answer>'.",
                 "task": {"generation_padding": "left"}},  # input_ids for generation
    batch_size=8, max_sequence_length=512,
)
config = RuntimeConfig(parallel_layout=ParallelLayout(dp=2),
                       bundle_resources={"CPU": 0.25}, rank_actor_num_cpus=0.25,
                       name="rl_prompts", namespace="rl_example")
coordinator = start_data_coordinator(config, spec)  # keep the handle while it runs
data = attach("rl_prompts", namespace="rl_example")  # from any process of the cluster


def rl_step(step, batches):
    """Generate and score one step's prompts (a stand-in policy); return their ids."""
    ids, rewards = [], []
    for batch in batches:  # one BatchedDataDict of DatumSpec rows per DP rank
        prompts = batch["input_ids"]  # [8, longest prompt], left-padded
        truths = [info["ground_truth"] for info in batch["extra_env_info"]]
        responses = [f"... so the answer is #### {truth}" for truth in truths]
        rewards += [math_reward(text, truth) for text, truth in zip(responses, truths)]
        ids += batch["idx"]  # each prompt's position in its split: stable across restores
    shape, score = tuple(prompts.shape), f"{sum(rewards):g}/{len(rewards)}"
    print(f"step {step}: {len(batches)} x input_ids {shape}, reward {score}")
    return ids


trained = {}
with data.prefetched_steps() as steps:  # step k + 1 is fetched while step k trains
    for step, batches in steps:  # asking for the next step marks this one trained
        trained[step] = rl_step(step, batches)
        if step == 2:
            steps.commit_trained()  # commit every step returned so far, then save
            data.save_checkpoint(f"{work}/data_checkpoint")  # the data after step 2
        if step == 4:
            break
# As a restart from step 2's checkpoint would: rewind the running coordinator.
print("rewound to step", data.load_checkpoint(f"{work}/data_checkpoint"))
for _ in range(2):
    step, refs = data.next_step()  # steps 3 and 4 again
    again = rl_step(step, [data.fetch(ref, "cpu") for ref in refs])
    same = again == trained[step]
    print(f"step {step} after the rewind: same prompts as before: {same}")
    data.commit(step)
ray.shutdown()
