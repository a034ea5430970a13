#!/usr/bin/env bash
# Set everything up and run the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export RAY_AUTH_MODE=token RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest "$@"
