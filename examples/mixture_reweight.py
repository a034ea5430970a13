"""A mixture of two datasets: blended by weight, restored exactly, re-weighted on purpose.

Preprocesses two members (chitchat conversations and arithmetic question/answer pairs;
Ray Data, on a local Ray it starts), then reads the mixture with one in-process loader:
each batch says which member each row came from. A checkpoint restores into a loader with
other weights only when asked to (reweight=True); every member then continues from its
own position, and the samples drawn from then on follow the new weights (the ~100 already
in the shuffle buffer come out first). Last, one member alone in exact passes: each for
loop is one pass, its partial last batch dropped and counted.
"""

import json
import tempfile
from pathlib import Path

import ray

from rl_data import (
    PreprocessConfig,
    arithmetic_word_problems,
    build_energon_sft_loader,
    chitchat_conversations,
    load_qwen3_tokenizer,
    run_preprocess,
)

tokenizer = load_qwen3_tokenizer()


def loader(source):
    """One in-process train loader (logical shard 0 of 1) over ``source``."""
    return build_energon_sft_loader(
        data_config={"energon": {}, "shuffle": True}, source=source, processor=tokenizer,
        batch_size=4, max_sequence_length=1024, split_role="train", logical_rank=0,
        logical_world_size=1, placement_fingerprint="single-process", packing_algorithm=None,
        max_sequences_per_bin=None, sequence_length_pad_multiple=1, only_unmask_final=False,
    )


def mixture(chat_weight, math_weight):
    return {"mixture": [{"name": "chat", "path": f"{work}/chat", "weight": chat_weight},
                        {"name": "math", "path": f"{work}/math", "weight": math_weight}],
            "split": "train", "epoch_mode": "virtual", "virtual_epoch_length": 3}


with tempfile.TemporaryDirectory() as work:
    members = {
        "chat": [{"messages": c["messages"]} for c in chitchat_conversations(40)],
        "math": arithmetic_word_problems(42),  # {"question", "answer"} rows
    }
    for name, rows in members.items():
        raw = Path(f"{work}/{name}.jsonl")
        raw.write_text("".join(json.dumps(row) + "\n" for row in rows))
        run_preprocess(PreprocessConfig(inputs=[str(raw)], output=f"{work}/{name}",
                                        splits={"train": 1.0}, progress=False))

    first = loader(mixture(0.8, 0.2))
    for batch in first:  # one for loop = virtual_epoch_length batches
        print("members of the batch:", batch["source_datasets"])
    state = first.state_dict()
    print("samples per member so far:", first.mixture["counts"])
    first.close()

    reweighted = loader(mixture(0.2, 0.8))
    try:
        reweighted.load_state_dict(state)
    except ValueError as error:
        print("refused:", str(error).replace("; ", ";\n  "))
    reweighted.load_state_dict(state, reweight=True)
    math_per_loop = [sum(b["source_datasets"].count("math") for b in reweighted)
                     for _ in range(12)]
    print("math samples per 12 after re-weighting:", math_per_loop)  # the buffer drains first
    print("weight history:", reweighted.mixture["history"])
    reweighted.close()

    # one member alone, in exact passes: virtual_epoch_length 0 makes each for loop one pass
    passes = loader({"path": f"{work}/math", "split": "train", "virtual_epoch_length": 0})
    for number in (1, 2):
        ids = [key for batch in passes for key in batch["source_ids"]]
        print(f"pass {number}: {len(ids)} samples, {len(set(ids))} distinct, "
              f"dropped so far {passes.dropped_samples}")
    passes.close()

ray.shutdown()  # run_preprocess started a local Ray
