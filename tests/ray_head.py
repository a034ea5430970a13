"""A private Ray head for ``ray job submit`` tests (marked ``ray_head``), and job helpers.

The head runs as ``ray start --head --block`` on free ports in its own temp dir, with stdout
in a log file (a full pipe would stall Ray), and is stopped by terminating that process (it
shuts down the processes it started), never by ``ray stop``, which would stop every Ray on
the machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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


def client_env() -> dict[str, str]:
    """Environment for `ray` CLI calls: token auth, the venv's `ray`/`python` first, no RAY_ADDRESS."""
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0",
           "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    return env


@dataclass(frozen=True)
class RayHead:
    address: str  # http://127.0.0.1:<dashboard port> (job API)
    gcs_address: str
    log: Path


@contextlib.contextmanager
def local_ray_head(log_dir: Path, num_cpus: int = 2) -> Iterator[RayHead]:
    """Start a head on free ports; yield its addresses; stop it by SIGTERM and remove its temp dir."""
    env = client_env()
    gcs_port, dashboard_port, agent_port = free_port(), free_port(), free_port()
    temp_dir = tempfile.mkdtemp(prefix="rlhead-", dir="/tmp")
    log = log_dir / "head.log"
    head = subprocess.Popen(
        [str(VENV_BIN / "ray"), "start", "--head", "--block", f"--num-cpus={num_cpus}", "--disable-usage-stats",
         f"--port={gcs_port}", f"--dashboard-port={dashboard_port}", "--include-dashboard=true",
         f"--dashboard-agent-listen-port={agent_port}",  # the default 52365 may belong to another Ray
         f"--temp-dir={temp_dir}"],
        env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )
    try:
        wait_for_dashboard(dashboard_port, head, log)
        yield RayHead(f"http://127.0.0.1:{dashboard_port}", f"127.0.0.1:{gcs_port}", log)
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)


def submit_job(address: str, job_id: str, entrypoint: list[str]) -> None:
    """`ray job submit --working-dir . --no-wait -- <entrypoint>` from the repository root."""
    command = [str(VENV_BIN / "ray"), "job", "submit", "--address", address, "--working-dir", ".",
               "--submission-id", job_id, "--no-wait", "--", *entrypoint]
    for _ in range(20):  # the job agent starts a few seconds after the dashboard port opens
        submit = subprocess.run(command, cwd=REPO, env=client_env(), capture_output=True, text=True, timeout=60)
        if submit.returncode == 0 or "No available agent" not in submit.stderr + submit.stdout:
            break
        time.sleep(2)
    assert submit.returncode == 0, submit.stdout + submit.stderr


def wait_for_job(address: str, job_id: str, timeout: float) -> tuple[str, str]:
    """``(final status name, logs)`` of a submitted job."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(address)
    deadline = time.monotonic() + timeout
    final = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
    while (status := client.get_job_status(job_id)) not in final:
        if time.monotonic() > deadline:
            client.stop_job(job_id)
            raise TimeoutError(f"job {job_id} still {status} after {timeout} s: {client.get_job_logs(job_id)[-4000:]}")
        time.sleep(1)
    return status.name, client.get_job_logs(job_id)
