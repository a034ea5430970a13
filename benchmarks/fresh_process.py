"""Run an in-process contender (a, d) in a fresh Python process, clocked like the Ray contenders.

A trainer that loads its data in-process pays, before its first batch, for importing the
loader's libraries (Energon, transformers, torchdata), loading the tokenizer and building the
loader; rl_data's rank actors and Ray Data's map actors pay the same in their own processes,
inside the clock. So a and d run in a new interpreter (``python -m benchmarks.fresh_process``,
not a multiprocessing spawn, which would re-import the caller's main module) that has
imported torch (a trainer has it anyway) and nothing else when the clock starts.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONTENDER_MODULES = {"a": "benchmarks.energon_bare", "d": "benchmarks.torchdata_loader"}


def run_in_fresh_process(contender: str, workload: Any, settings: Any, *, packing: bool, **options: Any) -> dict[str, Any]:
    """``CONTENDER_MODULES[contender].run(workload, settings, packing=..., start=..., **options)`` in a new process.

    ``options`` are the contender's own keyword arguments (e.g. ``workers`` for d), pickled with
    the rest of the request.
    """
    with tempfile.TemporaryDirectory(prefix="rl_data_bench_fresh-") as folder:
        request, reply = Path(folder) / "request.pkl", Path(folder) / "reply.pkl"
        request.write_bytes(pickle.dumps((contender, workload, settings, packing, options)))
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.fresh_process", str(request), str(reply)],
            timeout=settings.ray_timeout_s * 4,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if not reply.exists():
            tail = "\n".join(done.stderr.splitlines()[-20:])
            raise RuntimeError(f"contender {contender}'s process exited with {done.returncode} and no result:\n{tail}")
        ok, payload = pickle.loads(reply.read_bytes())
    if not ok:
        raise RuntimeError(f"contender {contender} failed in its process:\n{payload}")
    return payload


def _main(request: str, reply: str) -> None:
    import importlib
    import os
    import traceback

    import torch

    torch.set_num_threads(1)  # as in the suite's process (see suite.py)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    contender, workload, settings, packing, options = pickle.loads(Path(request).read_bytes())
    try:
        start = time.perf_counter()
        module = importlib.import_module(CONTENDER_MODULES[contender])
        outcome = (True, module.run(workload, settings, packing=packing, start=start, **options))
    except BaseException:
        outcome = (False, traceback.format_exc(limit=8))
    Path(reply).write_bytes(pickle.dumps(outcome))


if __name__ == "__main__":
    _main(*sys.argv[1:3])
