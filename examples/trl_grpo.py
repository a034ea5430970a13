"""TRL: the prompt feed as the train dataset of GRPOTrainer, each prompt trained once.

Needs the extra ``trl``. The policy is a tiny random Qwen2 model on the CPU.
"""

import os
import tempfile
from pathlib import Path

import ray
from transformers import Qwen2Config, Qwen2ForCausalLM
from trl import GRPOConfig, GRPOTrainer

from rl_data import (FeedConfig, LoaderSpec, ParallelLayout, PreprocessConfig,
                     RuntimeConfig, attach_feed, load_qwen3_tokenizer, math_reward,
                     run_preprocess, start_prompt_feed, write_gsm8k_rows)
from rl_data.integrations.trl import FEED_FOLDER, TRLPromptFeed

work = Path(tempfile.mkdtemp())
write_gsm8k_rows(work / "gsm8k.jsonl", 12)  # or your own GSM8K-style rows
run_preprocess(PreprocessConfig(inputs=[f"{work}/gsm8k.jsonl"], output=f"{work}/prompts",
                                task="rl_prompt", splits={"train": 1.0}, progress=False))
spec = LoaderSpec(
    source={"path": f"{work}/prompts", "split": "train"},
    data_config={"energon": {"task": "rl_prompt"}, "shuffle": True,
                 # rows carry the messages: TRL applies the chat template itself
                 "task": {"prompt_messages": True, "generation_padding": "none"}},
    batch_size=3, max_sequence_length=512,
)
config = RuntimeConfig(parallel_layout=ParallelLayout(dp=2),
                       bundle_resources={"CPU": 0.25}, rank_actor_num_cpus=0.25,
                       name="trl_prompts", namespace="trl_example")
feed = start_prompt_feed(config, spec, FeedConfig(max_outstanding=64))  # keep the handle


def accuracy(completions, ground_truth, **kwargs):  # ground_truth: from extra_env_info
    texts = [completion[0]["content"] for completion in completions]
    return [math_reward(text, truth) for text, truth in zip(texts, ground_truth)]


tokenizer = load_qwen3_tokenizer()  # your policy's tokenizer and model
model = Qwen2ForCausalLM(Qwen2Config(
    vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
args = GRPOConfig(
    output_dir=f"{work}/grpo", max_steps=4, save_steps=2, per_device_train_batch_size=4,
    num_generations=2, max_completion_length=8, use_cpu=True, bf16=False, report_to=[],
    shuffle_dataset=False, ignore_data_skip=True)  # required: the feed does both
source = TRLPromptFeed(feed, reward_funcs=[accuracy])
trainer = GRPOTrainer(model=model, reward_funcs=[accuracy], args=args,
                      processing_class=tokenizer, train_dataset=source.train_dataset,
                      callbacks=[source.callback])
# After a crash: a new TRLPromptFeed and trainer, then train(resume_from_checkpoint=True).
trainer.train()

status = attach_feed("trl_prompts", namespace="trl_example").trainer.status()
print(f"optimizer steps {trainer.state.global_step}; "
      f"prompts acked {status['totals']['acked']}, outstanding {status['outstanding']}")
for checkpoint in sorted((work / "grpo").glob("checkpoint-*")):
    print(f"{checkpoint.name}: feed state {sorted(os.listdir(checkpoint / FEED_FOLDER))}")
ray.shutdown()
