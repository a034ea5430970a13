"""``ray job submit --working-dir . -- python pipelines/train_sft_demo.py`` against a locally started head."""

from __future__ import annotations

import uuid

import pytest
import torch
from ray_head import local_ray_head, submit_job, wait_for_job


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ray_job_submit_runs_the_main_job_and_it_proves_the_continuation(tmp_path):
    work = tmp_path / "work"
    job_id = f"train-sft-demo-{uuid.uuid4().hex[:8]}"
    entrypoint = ["python", "pipelines/train_sft_demo.py", "--work-dir", str(work), "--ranks", "2",
                  "--batch-size", "2", "--seq-len", "256", "--steps", "2", "--resume-steps", "2",
                  "--num-conversations", "32", "--namespace", "rl_data_job_test", "--no-progress"]
    with local_ray_head(tmp_path, num_cpus=2) as head:
        submit_job(head.address, job_id, entrypoint)
        status, logs = wait_for_job(head.address, job_id, timeout=500)
    assert status == "SUCCEEDED", logs[-6000:]
    assert "PASS: the resumed run reproduced all 2 steps x 2 ranks after the checkpoint exactly" in " ".join(logs.split())
    for text in ("one encoded conversation", "(preprocessed now)", "train_sft_demo summary", "tokens/s",
                 "packing efficiency", "skipped samples", "dashboard", f"{work}/checkpoint/rl_data_state.pt"):
        assert text in logs, text
    assert torch.load(work / "checkpoint" / "rl_data_state.pt", weights_only=True)["content"]["step"] == 2
    assert (work / "dataset-chat_sft-32" / ".nv-meta").is_dir()
