"""GRPO-shaped job on the prompt feed: async rollouts, dynamic sampling, checkpoints, chaos, accounting.

    python pipelines/grpo_demo.py [--workers 3] [--epochs 3] [--kill-all-at-step 11]
    RAY_AUTH_MODE=token ray job submit --working-dir . -- python pipelines/grpo_demo.py --work-dir /abs/dir

Inside a Ray job (``$RAY_ADDRESS`` is set) it attaches to the cluster; otherwise it starts a
local Ray. See ``rl_data.jobs.grpo.demo`` for what it does; it ends with PASS (every prompt of
every finished epoch resolved exactly once) or FAIL (exit code 1).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # rl_data from the job's working dir

import typer  # noqa: E402

from rl_data.jobs.grpo.command import grpo_demo  # noqa: E402

if __name__ == "__main__":
    typer.run(grpo_demo)
