"""``ray job submit --working-dir . -- python pipelines/<job>.py``: the three jobs on one local head.

The jobs run one after another on the module's head (``tests/ray_head.py``), as on a cluster:
the preprocess job writes a dataset, the SFT demo trains on it, the GRPO demo makes its own. Each
test checks what only a submitted job shows: the entrypoint runs from the uploaded working dir,
attached to the cluster; its exit status, its logs and the files it wrote. The demos run small:
their chaos, several ranks and their own preprocessing are covered in-process by
``test_grpo_demo.py`` and ``test_train_sft_demo.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from preprocess_fixtures import read_quarantine, read_shards, write_jsonl
from ray_head import RayHead, local_ray_head, submit_job, wait_for_job

from rl_data.preprocess.pipeline import load_dataset_info
from rl_data.preprocess.transform import sample_key

#: the first test also waits for the head and the preprocess job
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def head(tmp_path_factory) -> Iterator[RayHead]:
    with local_ray_head(tmp_path_factory.mktemp("ray_head"), num_cpus=2) as head:
        yield head


def run_job(head: RayHead, name: str, entrypoint: list[str], timeout: float) -> tuple[str, str]:
    """Submit ``entrypoint`` as a job; return its final status name and its logs."""
    job_id = f"{name}-{uuid.uuid4().hex[:8]}"
    submit_job(head.address, job_id, entrypoint)
    return wait_for_job(head.address, job_id, timeout=timeout)


@pytest.fixture(scope="module")
def preprocessed(head, tmp_path_factory, chat_conversations) -> Path:
    """The preprocess job's dataset of 12 real conversations and a broken row, a sample per shard."""
    root = tmp_path_factory.mktemp("preprocess")
    rows = [{"messages": c["messages"]} for c in chat_conversations[:12]] + ["{broken"]
    write_jsonl(root / "in" / "chat.jsonl", rows)
    output = root / "dataset"
    entrypoint = ["python", "pipelines/preprocess.py", str(root / "in" / "*.jsonl"), "-o", str(output),
                  "--target-shard-rows", "1", "--no-progress"]
    status, logs = run_job(head, "preprocess", entrypoint, timeout=200)
    assert status == "SUCCEEDED", logs[-4000:]
    return output


def test_the_preprocess_job_writes_the_dataset_and_quarantines_the_broken_row(preprocessed):
    info = load_dataset_info(preprocessed)
    assert info["counts"]["read"] == 13 and info["counts"]["accepted"] == 12
    assert info["counts"]["quarantined_by_reason"] == {"invalid_json": 1}
    assert set(read_shards(preprocessed)) == {sample_key("chat.jsonl", row) for row in range(12)}
    assert read_quarantine(preprocessed)[0]["row"] == 12


def test_the_sft_demo_job_trains_on_that_dataset_and_proves_the_continuation(head, preprocessed, tmp_path):
    work = tmp_path / "work"
    entrypoint = ["python", "pipelines/train_sft_demo.py", "--data", str(preprocessed), "--work-dir", str(work),
                  "--ranks", "1", "--batch-size", "2", "--seq-len", "256", "--steps", "2", "--resume-steps", "2",
                  "--namespace", "rl_data_job_test", "--no-progress"]
    status, logs = run_job(head, "train-sft-demo", entrypoint, timeout=500)
    assert status == "SUCCEEDED", logs[-6000:]
    text = " ".join(logs.split())
    for expected in ("one encoded conversation", f"dataset {preprocessed} (existing, reused)", "train_sft_demo summary",
                     "tokens/s", "packing efficiency", "skipped samples", "dashboard",
                     f"{work}/checkpoint/rl_data_state.pt",
                     "PASS: the resumed run reproduced all 2 steps x 1 ranks after the checkpoint exactly"):
        assert expected in text, expected
    assert torch.load(work / "checkpoint" / "rl_data_state.pt", weights_only=True)["content"]["step"] == 2


def test_the_grpo_demo_job_preprocesses_its_prompts_and_resolves_each_exactly_once(head, tmp_path):
    work = tmp_path / "work"
    entrypoint = ["python", "pipelines/grpo_demo.py", "--work-dir", str(work), "--num-prompts", "16", "--ranks", "1",
                  "--dp", "1", "--workers", "1", "--epochs", "1", "--groups-per-step", "2", "--checkpoint-every", "1",
                  "--kill-worker-at-step", "0", "--kill-all-at-step", "0", "--namespace", "rl_data_grpo_job_test",
                  "--no-progress"]
    status, logs = run_job(head, "grpo-demo", entrypoint, timeout=500)
    assert status == "SUCCEEDED", logs[-6000:]
    text = " ".join(logs.split())
    for expected in ("preprocessed 16 of 16 rows", "prompt accounting per epoch",
                     "PASS: 1 epochs x 16 prompts: 0 duplicated, 0 missing"):
        assert expected in text, expected
    assert (work / "checkpoint" / "latest").is_file() and (work / "prompts-16" / ".nv-meta").is_dir()
