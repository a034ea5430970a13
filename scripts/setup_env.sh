#!/usr/bin/env bash
# Create and fill .venv (idempotent): Python 3.11, torch==2.13.0 (CPU wheel) first, then the project.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
stamp=.venv/.rl_data-installed
want="$(cat pyproject.toml scripts/setup_env.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# torch first, pinned: an unpinned torch may pull a multi-GB CUDA build.
.venv/bin/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test,multimodal,train,trl,docs]"
echo "$want" > "$stamp"
echo "setup_env: .venv ready ($(.venv/bin/python -c 'import torch, ray, transformers; print("torch", torch.__version__, "ray", ray.__version__, "transformers", transformers.__version__)'))"
