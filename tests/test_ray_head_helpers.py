"""The helpers that start a private Ray head for ``ray job submit`` tests, and the suite's Ray folder.

A loaded machine once made ``ray job submit`` fail with "connection refused" from the test's own
head, which the old retry loop did not retry; and ``.ci/run`` used to delete every
``/tmp/ray/session_*`` folder, including those of other Ray clusters on the machine.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ray_head import TEST_RAY_ROOT, is_transient_submit_failure, port_is_open, wait_for_head

REPO = Path(__file__).resolve().parents[1]

#: What `ray job submit` printed on the loaded machine (shortened).
CONNECTION_REFUSED = (
    "ConnectionError: Failed to connect to Ray at address: http://127.0.0.1:41234.\n"
    "aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host 127.0.0.1:41234 "
    "ssl:default [Connect call failed ('127.0.0.1', 41234)] Connection refused"
)


@pytest.mark.parametrize(
    "output",
    [CONNECTION_REFUSED, "RuntimeError: Request failed with status code 500: No available agent to submit job, please try again later."],
)
def test_head_start_up_failures_are_retried(output):
    assert is_transient_submit_failure(output)


@pytest.mark.parametrize(
    "output",
    ["Job with submission_id preprocess-1 already exists.", "RuntimeError: working_dir . does not exist"],
)
def test_real_submit_failures_are_not_retried(output):
    assert not is_transient_submit_failure(output)


@pytest.mark.timeout(30)
def test_waiting_for_a_head_whose_agent_never_listens_is_bounded(tmp_path):
    with socket.socket() as dashboard:  # a "dashboard" port that accepts connections but speaks no HTTP
        dashboard.bind(("127.0.0.1", 0))
        dashboard.listen()
        head = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        started = time.monotonic()
        try:
            with pytest.raises(TimeoutError, match=r"Ray head not ready after 2 s: still waiting for the dashboard's /api/version"):
                wait_for_head(dashboard.getsockname()[1], 1, head, tmp_path / "head.log", timeout=2)
        finally:
            head.kill()
            head.wait()
    assert time.monotonic() - started < 10
    assert not port_is_open(1)


def test_the_test_session_keeps_its_ray_folder_out_of_tmp_ray(ray_session):
    session_dir = Path(ray_session._private.worker._global_node.get_session_dir_path())
    assert TEST_RAY_ROOT in session_dir.parents, session_dir
    assert Path("/tmp/ray") not in session_dir.parents


def test_ci_removes_only_the_suites_own_ray_folders():
    ci = (REPO / ".ci" / "run").read_text()
    assert "/tmp/ray/" not in ci and "/tmp/ray " not in ci, "CI must not delete other Ray clusters' sessions"
    # a fresh folder per run (mktemp), removed at the end: never another run's folders
    assert 'export RL_DATA_TEST_RAY_ROOT="$(mktemp -d /tmp/rl_data_ci.XXXXXX)"' in ci and 'rm -rf "$RL_DATA_TEST_RAY_ROOT"' in ci
