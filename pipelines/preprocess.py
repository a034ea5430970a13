"""Preprocess raw conversation data into an Energon dataset with Ray Data.

    python pipelines/preprocess.py data/*.jsonl -o /abs/path/dataset
    RAY_AUTH_MODE=token ray job submit --working-dir . -- \
        python pipelines/preprocess.py /abs/in/*.jsonl -o /abs/path/dataset

Inside a Ray job (``$RAY_ADDRESS`` is set) it attaches to the cluster, otherwise it uses a
running local cluster or starts one. Input paths must be readable from every node; the output
is written by the driver and must be on storage the training nodes can read. See
``rl_data.preprocess`` for the stages and the output layout.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # rl_data from the job's working dir

import typer  # noqa: E402

from rl_data.preprocess.command import preprocess  # noqa: E402

if __name__ == "__main__":
    typer.run(preprocess)
