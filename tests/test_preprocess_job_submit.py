"""``ray job submit --working-dir . -- python pipelines/preprocess.py`` against a locally started head.

The head comes from ``tests/ray_head.py`` (its own ports and temp dir, stopped by SIGTERM).
"""

from __future__ import annotations

import uuid

import pytest
from preprocess_fixtures import read_quarantine, read_shards, write_jsonl
from ray_head import local_ray_head, submit_job, wait_for_job

from rl_data.preprocess.pipeline import load_dataset_info
from rl_data.preprocess.transform import sample_key


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ray_job_submit_runs_the_job_end_to_end(tmp_path, chat_conversations):
    rows = [{"messages": c["messages"]} for c in chat_conversations[:12]] + ["{broken"]
    write_jsonl(tmp_path / "in" / "chat.jsonl", rows)
    output = tmp_path / "dataset"
    job_id = f"preprocess-{uuid.uuid4().hex[:8]}"
    with local_ray_head(tmp_path) as head:
        submit_job(head.address, job_id, ["python", "pipelines/preprocess.py", str(tmp_path / "in" / "*.jsonl"),
                                          "-o", str(output), "--target-shard-rows", "1", "--no-progress"])
        status, logs = wait_for_job(head.address, job_id, timeout=200)
        assert status == "SUCCEEDED", logs[-4000:]

    info = load_dataset_info(output)
    assert info["counts"]["read"] == 13 and info["counts"]["accepted"] == 12
    assert info["counts"]["quarantined_by_reason"] == {"invalid_json": 1}
    assert set(read_shards(output)) == {sample_key("chat.jsonl", row) for row in range(12)}
    assert read_quarantine(output)[0]["row"] == 12
