"""Preprocess messy input: every rejected row lands in the quarantine file with its reason.

Writes 60 real chitchat conversations plus a handful of broken rows into a JSONL file,
runs the preprocess job (Ray Data, on a local Ray it starts), and prints the summary, the
quarantined rows by reason and the dataset folder. Then runs the job again with no
failure budget: it stops with one error and leaves no output behind.
"""

import json
import os
import tempfile
from pathlib import Path

import ray

from rl_data import PreprocessConfig, chitchat_conversations, run_preprocess


def row(*turns):
    return json.dumps({"messages": [{"role": r, "content": c} for r, c in turns]})


with tempfile.TemporaryDirectory() as work:
    rows = [json.dumps({"messages": c["messages"]}) for c in chitchat_conversations(60)]
    rows += [
        rows[0],                                                        # duplicate: kept
        '{"messages": [{"role": "user", "content": "unfinished"',       # invalid_json
        row(("user", "hello?")),                                        # no_assistant_turn
        row(("user", "hi<|im_end|>"), ("assistant", "hey")),            # control_text
        row(("user", "\ud800"), ("assistant", "x")),                    # invalid_unicode
        row(("narrator", "once"), ("assistant", "upon")),               # invalid_role
    ]
    raw = Path(work) / "chat.jsonl"
    bad_bytes = b'{"messages": "\xff"}\n'                                 # invalid_utf8
    raw.write_bytes(("\n".join(rows) + "\n").encode() + bad_bytes)

    summary = run_preprocess(PreprocessConfig(
        inputs=[str(raw)], output=f"{work}/dataset", splits={"train": 0.9, "val": 0.1},
        target_shard_rows=20, progress=False,
    ))
    print(f"read {summary.read}, accepted {summary.accepted}, "
          f"duplicates {summary.duplicates}, splits {summary.splits}, shards {summary.shards}")
    print(f"quarantined {summary.quarantined}: {summary.quarantined_by_reason}")
    for line in Path(f"{work}/dataset/quarantine.jsonl").read_text().splitlines():
        record = json.loads(line)
        print(f"  row {record['row']}: {record['reason']}: {record['message'][:60]}")
    print("dataset folder:", sorted(os.listdir(f"{work}/dataset")))

    strict = PreprocessConfig(inputs=[str(raw)], output=f"{work}/strict", progress=False,
                              max_failed_rows=0, max_failed_fraction=0.0)
    try:
        run_preprocess(strict)  # no failure budget: the job stops and writes nothing
    except Exception as error:  # noqa: BLE001 - print whatever the job raised
        print(f"strict run refused: {type(error).__name__}: {str(error)[:60]}...")
    print("strict output exists:", Path(f"{work}/strict").exists())

ray.shutdown()  # run_preprocess started a local Ray
