#!/usr/bin/env bash
# Build the documentation site with warnings as errors, or serve it while editing.
#   bash scripts/docs.sh         # set up .venv, regenerate docs/reference/, build docs/_build/html
#   bash scripts/docs.sh serve   # the same, then serve http://127.0.0.1:8000, rebuilding on every change
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-build}"
case "$mode" in
  build | serve) ;;
  *) echo "usage: bash scripts/docs.sh [serve]   (got '$mode')" >&2; exit 2 ;;
esac
bash scripts/setup_env.sh
export RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false
.venv/bin/python docs/generate.py
if [ "$mode" = build ]; then
  # -E: read every page again (an incremental build skips the warnings of unchanged pages)
  .venv/bin/python -m sphinx -W --keep-going -E -q -b html docs docs/_build/html
  echo "docs: built $(pwd)/docs/_build/html/index.html"
  exit 0
fi
echo "docs: serving http://127.0.0.1:8000 (Ctrl-C stops it)"
exec .venv/bin/sphinx-autobuild docs docs/_build/html --host 127.0.0.1 --port 8000 \
  --watch rl_data --watch examples --watch CHANGELOG.md \
  --pre-build ".venv/bin/python docs/generate.py" -W --keep-going
