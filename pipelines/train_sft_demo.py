"""Main job: preprocess real chat data, train on it with a checkpoint, restart, prove it is exact.

    python pipelines/train_sft_demo.py [--ranks 2] [--steps 6] [--resume-steps 4] [--packing first_fit_decreasing]
    RAY_AUTH_MODE=token ray job submit --working-dir . -- python pipelines/train_sft_demo.py --work-dir /abs/dir

Inside a Ray job (``$RAY_ADDRESS`` is set) it attaches to the cluster; otherwise it starts a
local Ray. It prints one encoded conversation, preprocesses the chitchat conversations into an
Energon dataset (unless ``--data`` names an existing one), runs the named coordinator with
``--ranks`` rank actors and one training actor per rank (on GPU when the cluster has GPUs),
checkpoints after ``--steps`` steps, records ``--resume-steps`` more steps, stops everything,
restores the checkpoint in fresh actors and compares the same steps: it prints PASS or FAIL
(exit code 1) and a summary. See ``rl_data.jobs`` for the parts.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # rl_data from the job's working dir

import typer  # noqa: E402

from rl_data.jobs.command import train_sft_demo  # noqa: E402

if __name__ == "__main__":
    typer.run(train_sft_demo)
