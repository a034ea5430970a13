"""A private Ray head for ``ray job submit`` tests, and job helpers.

The head runs as ``ray start --head --block`` on free ports in its own temp dir, with stdout
in a log file (a full pipe would stall Ray), and is stopped by terminating that process (it
shuts down the processes it started, without draining the node first), never by ``ray stop``,
which would stop every Ray on the machine.
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
#: Every Ray session folder the suite creates lives below this folder (never ``/tmp/ray``, which
#: other Ray clusters on the machine use); ``.ci/run`` removes only this folder.
TEST_RAY_ROOT = Path(os.environ.get("RL_DATA_TEST_RAY_ROOT", "/tmp/rl_data_tests"))


def private_ray_dir(prefix: str) -> str:
    """A new, empty Ray temp folder below :data:`TEST_RAY_ROOT` (short: Ray's socket paths are limited)."""
    TEST_RAY_ROOT.mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=TEST_RAY_ROOT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def http_ok(url: str) -> bool:
    """True when ``url`` answers HTTP 200 (token auth header included when a token exists)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url)
    token = Path.home() / ".ray" / "auth_token"
    if token.is_file():
        request.add_header("Authorization", f"Bearer {token.read_text().strip()}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_for_head(dashboard_port: int, agent_port: int, head: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    """Wait until the dashboard answers ``/api/version`` and the job agent listens; bounded.

    A dashboard port that accepts connections is not enough: ``ray job submit`` then still
    gets "connection refused" or "No available agent" until the job agent is up.
    """
    deadline = time.monotonic() + timeout
    waiting_for = "the dashboard"
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"ray start exited with {head.returncode}: {log.read_text()[-3000:]}")
        if not http_ok(f"http://127.0.0.1:{dashboard_port}/api/version"):
            waiting_for = f"the dashboard's /api/version on port {dashboard_port}"
        elif not port_is_open(agent_port):
            waiting_for = f"the job agent on port {agent_port}"
        else:
            return
        time.sleep(0.5)
    raise TimeoutError(f"Ray head not ready after {timeout:g} s: still waiting for {waiting_for}; log: {log}")


#: Output of a failed ``ray job submit`` that means "the head is not ready yet, try again".
TRANSIENT_SUBMIT_ERRORS = ("No available agent", "Connection refused", "Cannot connect to host",
                           "Failed to connect", "Service Unavailable", "ConnectionResetError")


def is_transient_submit_failure(output: str) -> bool:
    """True when a failed ``ray job submit`` should be retried (the head or its agent is starting)."""
    return any(marker in output for marker in TRANSIENT_SUBMIT_ERRORS)


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
    # on SIGTERM, stop at once: by default Ray first drains the node for up to 30 s, and after a
    # job it waited out the full 30 s
    env = {**client_env(), "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    gcs_port, dashboard_port, agent_port = free_port(), free_port(), free_port()
    temp_dir = private_ray_dir("head-")
    log = log_dir / "head.log"
    head = subprocess.Popen(
        [str(VENV_BIN / "ray"), "start", "--head", "--block", f"--num-cpus={num_cpus}", "--disable-usage-stats",
         f"--port={gcs_port}", f"--dashboard-port={dashboard_port}", "--include-dashboard=true",
         f"--dashboard-agent-listen-port={agent_port}",  # the default 52365 may belong to another Ray
         f"--temp-dir={temp_dir}"],
        env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )
    try:
        wait_for_head(dashboard_port, agent_port, head, log)
        yield RayHead(f"http://127.0.0.1:{dashboard_port}", f"127.0.0.1:{gcs_port}", log)
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)


def submit_job(address: str, job_id: str, entrypoint: list[str], timeout: float = 120) -> None:
    """`ray job submit --working-dir . --no-wait -- <entrypoint>` from the repository root.

    Retries, until ``timeout``, only failures that mean the head is still starting
    (:func:`is_transient_submit_failure`); any other failure fails at once with its output.
    """
    command = [str(VENV_BIN / "ray"), "job", "submit", "--address", address, "--working-dir", ".",
               "--submission-id", job_id, "--no-wait", "--", *entrypoint]
    deadline = time.monotonic() + timeout
    while True:
        submit = subprocess.run(command, cwd=REPO, env=client_env(), capture_output=True, text=True, timeout=60)
        output = submit.stdout + submit.stderr
        if submit.returncode == 0 or not is_transient_submit_failure(output) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert submit.returncode == 0, output


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
