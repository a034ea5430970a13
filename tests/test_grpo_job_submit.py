"""``ray job submit --working-dir . -- python pipelines/grpo_demo.py`` against a locally started head."""

from __future__ import annotations

import uuid

import pytest
from ray_head import local_ray_head, submit_job, wait_for_job


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ray_job_submit_runs_the_grpo_demo_through_its_chaos_and_it_passes(tmp_path):
    work = tmp_path / "work"
    job_id = f"grpo-demo-{uuid.uuid4().hex[:8]}"
    entrypoint = ["python", "pipelines/grpo_demo.py", "--work-dir", str(work), "--num-prompts", "32",
                  "--workers", "2", "--epochs", "2", "--groups-per-step", "2", "--kill-worker-at-step", "2",
                  "--kill-all-at-step", "5", "--namespace", "rl_data_grpo_job_test", "--no-progress"]
    with local_ray_head(tmp_path, num_cpus=2) as head:
        submit_job(head.address, job_id, entrypoint)
        status, logs = wait_for_job(head.address, job_id, timeout=500)
    assert status == "SUCCEEDED", logs[-6000:]
    text = " ".join(logs.split())
    assert "PASS: 2 epochs x 32 prompts: 0 duplicated, 0 missing" in text, logs[-6000:]
    for expected in ("killed rollout worker", "killed every actor; restored step 3 on 1 DP trainer rank(s)", "prompt accounting per epoch"):
        assert expected in text, expected
    assert (work / "checkpoint" / "latest").is_file() and (work / "prompts-32" / ".nv-meta").is_dir()
