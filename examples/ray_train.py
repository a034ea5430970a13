"""Ray Train: TorchTrainer workers take their batches from the data coordinator, and
Train's checkpoints carry the data state.

Needs the extra ``train``.
"""

import json
import os
import tempfile
from pathlib import Path

# Before Ray starts: Train's 60 s to start its workers is tight on a busy machine.
os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "300")

import ray
import ray.train
import ray.train.torch
import torch
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from rl_data import (LoaderSpec, ParallelLayout, PreprocessConfig, RuntimeConfig, attach,
                     chitchat_conversations, run_preprocess, start_data_coordinator)
from rl_data.integrations.ray_train import TrainData, data_state, loop_config

work = Path(tempfile.mkdtemp())
rows = [json.dumps(conversation) + "\n" for conversation in chitchat_conversations(200)]
(work / "chat.jsonl").write_text("".join(rows))  # or your own conversations
run_preprocess(PreprocessConfig(inputs=[f"{work}/chat.jsonl"], output=f"{work}/chat",
                                target_shard_rows=20, progress=False))  # starts Ray
spec = LoaderSpec(source={"path": f"{work}/chat", "split": "train"},
                  data_config={"energon": {}, "shuffle": True},
                  batch_size=4, max_sequence_length=512)
config = RuntimeConfig(parallel_layout=ParallelLayout(dp=2),
                       bundle_resources={"CPU": 0.25}, rank_actor_num_cpus=0.25,
                       name="sft_data", namespace="train_example")


def train_loop(config):  # runs in every Train worker
    data = TrainData(config["data"])  # this worker is one DP rank of the coordinator
    model = ray.train.torch.prepare_model(torch.nn.EmbeddingBag(151_936, 16))  # DDP
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:  # a restarted worker group: data.steps resumes the data with it
        with checkpoint.as_directory() as directory:
            model.module.load_state_dict(torch.load(f"{directory}/model.pt"))
    for step, batch in data.steps(config["steps"], resume_from=checkpoint):
        loss = model(batch["input_ids"] * batch["token_mask"].long()).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        save = None
        if step % 5 == 0:
            def save(directory):  # your files; DP rank 0 adds the data state beside them
                torch.save(model.module.state_dict(), f"{directory}/model.pt")
        data.report({"loss": loss.item()}, save=save)  # ray.train.report, plus the data


coordinator = start_data_coordinator(config, spec)  # the driver owns it, before fit()
trainer = TorchTrainer(
    train_loop, train_loop_config={"data": loop_config(config), "steps": 10},
    scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),  # dp
    run_config=RunConfig(name="sft", storage_path=f"{work}/runs",
                         failure_config=FailureConfig(max_failures=2)),
)
result = trainer.fit()  # a failed run resumes in fit() again with the same RunConfig
state = data_state(result.checkpoint)  # the data state inside Train's last checkpoint
with result.checkpoint.as_directory() as directory:
    print("checkpoint files:", sorted(os.listdir(directory)))
loss = result.metrics["loss"]
print(f"data state: step {state['step']}, {len(state['ranks'])} ranks; loss {loss:.4g}")
print("coordinator:", attach("sft_data", namespace="train_example").progress())
ray.shutdown()
