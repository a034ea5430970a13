"""SFT quickstart: conversations -> dataset -> data coordinator -> steps -> checkpoint."""

import json
import tempfile
from pathlib import Path

import ray

from rl_data import (LoaderSpec, ParallelLayout, PreprocessConfig, RuntimeConfig, attach,
                     chitchat_conversations, run_preprocess, start_data_coordinator)

work = Path(tempfile.mkdtemp())
rows = [json.dumps(conversation) + "\n" for conversation in chitchat_conversations(64)]
(work / "chat.jsonl").write_text("".join(rows))  # or your own conversations
run_preprocess(PreprocessConfig(inputs=[f"{work}/chat.jsonl"], output=f"{work}/chat",
                                progress=False))  # starts Ray
spec = LoaderSpec(source={"path": f"{work}/chat", "split": "train"},
                  data_config={"energon": {}, "shuffle": True},
                  batch_size=4, max_sequence_length=512)
config = RuntimeConfig(parallel_layout=ParallelLayout(dp=2),
                       bundle_resources={"CPU": 0.25}, rank_actor_num_cpus=0.25)
coordinator = start_data_coordinator(config, spec)  # keep the handle while it runs
data = attach()  # the coordinator's client; any process of the cluster can attach
for _ in range(3):
    step, refs = data.next_step()  # one batch ref per DP rank: refs[r] goes to rank r
    batch = data.fetch(refs[0], "cpu")  # DP rank 0's BatchedDataDict
    print(f"step {step}: input_ids {tuple(batch['input_ids'].shape)}")  # train here
    data.commit(step)  # the step is trained: the data checkpoint covers it
print("data checkpoint:", data.save_checkpoint(f"{work}/data_checkpoint"))
ray.shutdown()
