"""``ray job submit --working-dir . -- python pipelines/preprocess.py`` against a locally started head.

The head runs as ``ray start --head --block`` in its own temp dir and is stopped by terminating
that process (it shuts down the processes it started), not by ``ray stop``, which would stop
every Ray on the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from preprocess_fixtures import read_quarantine, read_shards, write_jsonl

from rl_data.preprocess.pipeline import load_dataset_info
from rl_data.preprocess.transform import sample_key

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_dashboard(port: int, head: subprocess.Popen, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"ray start exited with {head.returncode}: {log.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"dashboard on port {port} not up after {timeout} s")


@pytest.mark.ray_head
@pytest.mark.timeout(300)
def test_ray_job_submit_runs_the_job_end_to_end(tmp_path, chat_conversations):
    from ray.job_submission import JobStatus, JobSubmissionClient

    rows = [{"messages": c["messages"]} for c in chat_conversations[:12]] + ["{broken"]
    write_jsonl(tmp_path / "in" / "chat.jsonl", rows)
    output = tmp_path / "dataset"
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0",
           "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    gcs_port, dashboard_port, agent_port = free_port(), free_port(), free_port()
    temp_dir = tempfile.mkdtemp(prefix="rlpp-", dir="/tmp")
    head_log = tmp_path / "head.log"
    head = subprocess.Popen(
        [str(VENV_BIN / "ray"), "start", "--head", "--block", "--num-cpus=2", "--disable-usage-stats",
         f"--port={gcs_port}", f"--dashboard-port={dashboard_port}", "--include-dashboard=true",
         f"--dashboard-agent-listen-port={agent_port}",  # the default 52365 may belong to another Ray
         f"--temp-dir={temp_dir}"],
        env=env, stdout=head_log.open("w"), stderr=subprocess.STDOUT,  # a full pipe would stall Ray
    )
    address = f"http://127.0.0.1:{dashboard_port}"
    job_id = f"preprocess-{uuid.uuid4().hex[:8]}"
    try:
        wait_for_dashboard(dashboard_port, head, head_log)
        command = [str(VENV_BIN / "ray"), "job", "submit", "--address", address, "--working-dir", ".",
                   "--submission-id", job_id, "--no-wait", "--",
                   "python", "pipelines/preprocess.py", str(tmp_path / "in" / "*.jsonl"), "-o", str(output),
                   "--target-shard-rows", "1", "--no-progress"]
        for _ in range(20):  # the job agent starts a few seconds after the dashboard port opens
            submit = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
            if submit.returncode == 0 or "No available agent" not in submit.stderr + submit.stdout:
                break
            time.sleep(2)
        assert submit.returncode == 0, submit.stdout + submit.stderr
        client = JobSubmissionClient(address)
        deadline = time.monotonic() + 200
        while (status := client.get_job_status(job_id)) not in {JobStatus.SUCCEEDED, JobStatus.FAILED,
                                                                 JobStatus.STOPPED}:
            assert time.monotonic() < deadline, f"job still {status}"
            time.sleep(1)
        assert status == JobStatus.SUCCEEDED, client.get_job_logs(job_id)[-4000:]
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)

    info = load_dataset_info(output)
    assert info["counts"]["read"] == 13 and info["counts"]["accepted"] == 12
    assert info["counts"]["quarantined_by_reason"] == {"invalid_json": 1}
    assert set(read_shards(output)) == {sample_key("chat.jsonl", row) for row in range(12)}
    assert read_quarantine(output)[0]["row"] == 12
