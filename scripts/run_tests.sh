#!/usr/bin/env bash
# Set everything up and run the test suite (CI adds --run-slow: the slow tests too).
# Tests whose own process connects to a Ray cluster of its own (not the session's local Ray) are
# marked `own_cluster` and run in a second pytest process. Tests that start a Ray head for
# `ray job submit` only talk to it over HTTP and run with the others (tests/ray_head.py stops a
# head by its own process, never by `ray stop`).
# The others run in RL_DATA_TEST_PROCESSES pytest processes (default 2; 1 = no pytest-xdist), each
# with its own local Ray; a test module stays in one process, the heaviest modules start first
# (tests/conftest.py: HEAVIEST_MODULES_FIRST).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
bash scripts/install_prometheus.sh  # tests/test_prometheus.py: a real Prometheus (Debian package, as root)
export RAY_AUTH_MODE=token RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false
processes="${RL_DATA_TEST_PROCESSES:-2}"
parallel=()
[ "$processes" -gt 1 ] && parallel=(-n "$processes" --dist loadfile --no-loadscope-reorder)
.venv/bin/python -m pytest -m "not own_cluster" "${parallel[@]}" "$@"
status=0
.venv/bin/python -m pytest -m own_cluster "$@" || status=$?
# exit code 5 = no test selected (e.g. a -k filter matched none of them)
[ "$status" -eq 0 ] || [ "$status" -eq 5 ] || exit "$status"
