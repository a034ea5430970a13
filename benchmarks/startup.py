"""Where a rank actor's start-up goes: each phase in a fresh interpreter, CPU and wall seconds.

``python -m benchmarks.startup [--packed]`` runs, in new Python processes that have imported
torch only (as contender a and d), the steps a rank actor takes before its first batch:
importing the loader stack, loading the tokenizer, the loader identity (vocabulary fingerprint),
building the loader and producing the first batch. Every phase is also run the way it was done
before this project's start-up work, in the same run, so each change is a ratio:

* tokenizer: ``PreTrainedTokenizerFast.from_pretrained`` (now) vs ``AutoTokenizer`` (before;
  imports transformers' model registry);
* fingerprint: the on-disk cache (now) vs the full vocabulary serialisation (before);
* task lookup: only the task the loader names (now) vs every built-in task (before).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def _phases(packed: bool, before: bool) -> dict[str, Any]:
    """Runs in the fresh process: ``{phase: [cpu_s, wall_s]}``."""
    import time

    import torch

    torch.set_num_threads(1)
    clock: dict[str, Any] = {}
    mark = [time.process_time(), time.perf_counter()]

    def lap(name: str) -> None:
        now = [time.process_time(), time.perf_counter()]
        clock[name] = [round(now[0] - mark[0], 3), round(now[1] - mark[1], 3)]
        mark[:] = now

    import megatron.energon  # noqa: F401

    import rl_data.distributed.rank_actor  # noqa: F401  (what a rank actor's class import pulls in)

    lap("import loader stack")
    from rl_data.tokenization.tokenizer import build_qwen3_tokenizer

    folder = str(build_qwen3_tokenizer())
    if before:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder)
    else:
        from rl_data.tokenization.tokenizer import load_qwen3_tokenizer

        tokenizer = load_qwen3_tokenizer()
    lap("load tokenizer")
    from rl_data.tokenization.vocab_fingerprint import full_vocab_fingerprint, vocab_fingerprint

    (full_vocab_fingerprint if before else vocab_fingerprint)(tokenizer)
    lap("vocabulary fingerprint")
    from rl_data.task_registry import get_task, registered_tasks

    if before:
        registered_tasks()
    get_task("chat_sft")
    lap("task lookup")
    from benchmarks.energon_bare import loader_kwargs
    from benchmarks.settings import BenchSettings
    from benchmarks.workload import prepare_workload
    from rl_data.energon.sft_dataloader import build_energon_sft_loader

    settings = BenchSettings()
    workload = prepare_workload(settings, REPO_ROOT / "benchmarks" / "results" / "cache")
    kwargs = loader_kwargs(workload, settings, packing=packed, rank=0, world_size=2)
    mark[:] = [time.process_time(), time.perf_counter()]
    loader = build_energon_sft_loader(processor=tokenizer, **kwargs)
    loader.state_dict()
    lap("build loader + initial state")
    next(iter(loader))
    lap("first batch")
    return clock


def measure(packed: bool = False, repeats: int = 3) -> dict[str, Any]:
    """Median over ``repeats`` fresh processes of each phase, now and before, with ratios."""
    runs: dict[str, list[dict[str, Any]]] = {"now": [], "before": []}
    for _ in range(repeats):
        for variant in runs:
            code = (
                "import json, sys; sys.path.insert(0, %r); from benchmarks.startup import _phases; "
                "print(json.dumps(_phases(%r, %r)))" % (str(REPO_ROOT), packed, variant == "before")
            )
            done = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=_env()
            )
            if done.returncode:
                raise RuntimeError(f"start-up probe failed:\n{done.stderr[-2000:]}")
            runs[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
    table = {}
    for phase in runs["now"][0]:
        now = _median([r[phase][0] for r in runs["now"]])
        before = _median([r[phase][0] for r in runs["before"]])
        table[phase] = {"cpu_s_now": now, "cpu_s_before": before, "now_vs_before": now / before if before else None}
    total_now = sum(v["cpu_s_now"] for v in table.values())
    total_before = sum(v["cpu_s_before"] for v in table.values())
    return {"packed": packed, "repeats": repeats, "phases": table, "cpu_s_now": total_now, "cpu_s_before": total_before}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO_ROOT)}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.startup", description=__doc__.splitlines()[0])
    parser.add_argument("--packed", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    result = measure(args.packed, args.repeats)
    print("| phase | CPU s now | CPU s before | now / before |\n|---|---|---|---|")
    for phase, row in result["phases"].items():
        ratio = row["now_vs_before"]
        print(f"| {phase} | {row['cpu_s_now']:.2f} | {row['cpu_s_before']:.2f} | {ratio:.2f} |" if ratio else f"| {phase} | {row['cpu_s_now']:.2f} | {row['cpu_s_before']:.2f} | - |")
    print(f"| total | {result['cpu_s_now']:.2f} | {result['cpu_s_before']:.2f} | {result['cpu_s_now'] / result['cpu_s_before']:.2f} |")


if __name__ == "__main__":
    main()
