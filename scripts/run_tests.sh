#!/usr/bin/env bash
# Set everything up and run the test suite (CI adds --run-slow: the slow tests too).
# Tests that start their own Ray head (`ray start` / `ray job submit` / `ray stop`) are marked
# `ray_head` and run in a second pytest process, so `ray stop` cannot touch the first one's Ray.
# The others run in RL_DATA_TEST_PROCESSES pytest processes (default 2; 1 = no pytest-xdist), each
# with its own local Ray; a test module stays in one process, the heaviest modules start first
# (tests/conftest.py: HEAVIEST_MODULES_FIRST).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export RAY_AUTH_MODE=token RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false
processes="${RL_DATA_TEST_PROCESSES:-2}"
parallel=()
[ "$processes" -gt 1 ] && parallel=(-n "$processes" --dist loadfile --no-loadscope-reorder)
.venv/bin/python -m pytest -m "not ray_head" "${parallel[@]}" "$@"
status=0
.venv/bin/python -m pytest -m ray_head "$@" || status=$?
# exit code 5 = no test selected (e.g. a -k filter matched none of them)
[ "$status" -eq 0 ] || [ "$status" -eq 5 ] || exit "$status"
