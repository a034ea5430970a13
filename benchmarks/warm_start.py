"""Time to the first step from a fresh Ray session: cold worker processes vs preloaded ones.

``python -m benchmarks.warm_start [--ranks 1 2] [--repeats 2] [--packed]`` (and the suite, before
its own Ray session starts: ``warm_start_*`` settings) runs, per repeat and per variant of
``warm_start_variants`` (all three by default), a new Python driver that starts a private local
Ray (``num_cpus`` = the machine's cores), waits until the raylet's prestarted idle workers are up
and quiet, then starts a data coordinator (contender b's loader arguments and CPU layout, no
consumer actor) and times ``start_data_coordinator`` + the first ``next_step`` + fetching its
batches. Variants (Ray's ``preload_python_modules``, see :mod:`rl_data.distributed.preload`):

* ``cold``: nothing preloaded (a rank actor imports torch, Energon, transformers, rl_data);
* ``torch``: torch preloaded: the footing of contender d, whose fresh process has imported
  torch when its clock starts;
* ``preload``: ``rl_data.distributed.preload`` (the whole loader stack).

Contender d (2 DataLoader workers, fresh process) runs in the same session for its time to first
batch. Ray prestarts one idle worker per CPU core and does not refill the pool, so on a 2-core
machine only the coordinator and the first rank get a prestarted process (telling Ray the node has
more CPUs does not prestart more: seen here with ``num_cpus=4``); the table says how many rank
actors did (``warm ranks``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
VARIANTS: dict[str, list[str]] = {"cold": [], "torch": ["torch"], "preload": ["rl_data.distributed.preload"]}
#: Seconds the raylet's idle workers must stay below 2 % CPU before the clock starts.
QUIET_S = 1.0


def _first_step(settings_json: str, cache_dir: str, ranks: int, packed: bool, modules: list[str]) -> dict[str, Any]:
    """Runs in the fresh driver: the first step's time and how many rank actors started warm."""
    import os
    import shutil
    import tempfile

    import psutil
    import ray

    from benchmarks.rl_data_actors import _start, _stop
    from benchmarks.settings import BenchSettings
    from benchmarks.workload import prepare_workload

    settings = BenchSettings.model_validate_json(settings_json)
    workload = prepare_workload(settings, Path(cache_dir))
    ray_dir = tempfile.mkdtemp(prefix="rl_data_bench_ray_")
    ray.init(
        address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, _temp_dir=ray_dir,
        _system_config={"preload_python_modules": modules} if modules else {},
    )
    try:
        _wait_for_quiet_pool(psutil, os.cpu_count() or 1)
        begin_wall, begin = time.time(), time.perf_counter()
        coordinator = _start(workload, settings, packing=packed, ranks=ranks, name="warm-start")
        _, refs = ray.get(coordinator.next_step.remote(), timeout=settings.ray_timeout_s)
        ray.get(refs, timeout=settings.ray_timeout_s)
        first_step_s = time.perf_counter() - begin
        status = ray.get(coordinator.status.remote(), timeout=settings.ray_timeout_s)
        warm = sum(psutil.Process(rank["pid"]).create_time() < begin_wall for rank in status["ranks"])
        _stop(coordinator, settings.ray_timeout_s)
    finally:
        ray.shutdown()
        shutil.rmtree(ray_dir, ignore_errors=True)
    return {"first_step_s": first_step_s, "warm_ranks": warm}


def _wait_for_quiet_pool(psutil: Any, expected: int, limit_s: float = 60.0) -> None:
    """Until ``expected`` idle workers exist and all of them stayed quiet for :data:`QUIET_S`."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:  # this driver's Ray session only: the raylet and its workers descend from it
            idle = [p for p in psutil.Process().children(recursive=True) if "ray::IDLE" in " ".join(p.cmdline())]
            if len(idle) >= expected and all(p.cpu_percent(interval=None) < 2 for p in idle):
                time.sleep(QUIET_S)
                if all(p.cpu_percent(interval=None) < 2 for p in idle):
                    return
        except psutil.Error:  # a worker ended between listing and reading it: look again
            pass
        time.sleep(0.25)
    raise TimeoutError(f"Ray's idle worker pool did not settle within {limit_s} s")


def measure(settings: Any, cache_dir: str | Path, packed: bool = False) -> dict[str, Any]:
    """Median first-step seconds per (ranks, variant) over ``settings.warm_start_repeats``, d's
    median first batch, and ratios; the workload is prepared in ``cache_dir``."""
    from benchmarks.fresh_process import run_in_fresh_process
    from benchmarks.workload import prepare_workload

    workload = prepare_workload(settings, Path(cache_dir))
    settings_json = settings.model_dump_json()
    d_settings = settings.model_copy(update={"samples_per_run": min(400, settings.samples_per_run), "wait_steps": 2})
    runs: dict[str, list[dict[str, Any]]] = {}
    d_first: list[float] = []
    for _ in range(settings.warm_start_repeats):  # interleaved: a slow moment hits every variant
        d = run_in_fresh_process("d", workload, d_settings, packing=packed, workers=2, restore=False)
        d_first.append(d["time_to_first_batch_s"])
        for ranks in settings.warm_start_rank_counts:
            for variant in settings.warm_start_variants:
                result = _run_driver(settings_json, str(cache_dir), ranks, packed, VARIANTS[variant])
                runs.setdefault(f"{ranks}/{variant}", []).append(result)
    d_median = statistics.median(d_first)
    rows = {}
    for key, results in runs.items():
        first = statistics.median([r["first_step_s"] for r in results])
        rows[key] = {
            "first_step_s": first,
            "every_repeat_s": [round(r["first_step_s"], 3) for r in results],
            "warm_ranks": [r["warm_ranks"] for r in results],
            "vs_d": first / d_median,
        }
    return {
        "packed": packed,
        "repeats": settings.warm_start_repeats,
        "d_first_batch_s": d_median,
        "d_every_repeat_s": d_first,
        "b": rows,
    }


def _run_driver(settings_json: str, cache_dir: str, ranks: int, packed: bool, modules: list[str]) -> dict[str, Any]:
    code = (
        "import json, sys; sys.path.insert(0, %r); from benchmarks.warm_start import _first_step; "
        "print(json.dumps(_first_step(sys.argv[1], sys.argv[2], %d, %r, %r)))" % (str(REPO_ROOT), ranks, packed, modules)
    )
    done = subprocess.run(
        [sys.executable, "-c", code, settings_json, cache_dir], capture_output=True, text=True, timeout=600, env=_env()
    )
    if done.returncode:
        raise RuntimeError(f"warm-start driver failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO_ROOT), "RAY_AUTH_MODE": "token"}


def main() -> None:
    from benchmarks.settings import BenchSettings

    parser = argparse.ArgumentParser(prog="python -m benchmarks.warm_start", description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--packed", action="store_true")
    args = parser.parse_args()
    settings = BenchSettings(warm_start_rank_counts=tuple(args.ranks), warm_start_repeats=args.repeats)
    result = measure(settings, REPO_ROOT / "benchmarks" / "results" / "cache", args.packed)
    print("\n".join(table(result)))
    print(json.dumps(result))


def table(result: dict[str, Any]) -> list[str]:
    """Markdown lines: d's first batch, then one row per (ranks, variant)."""
    lines = [
        f"d (2 DataLoader workers, fresh process) first batch: {result['d_first_batch_s']:.2f} s "
        f"(every repeat: {', '.join(f'{s:.2f}' for s in result['d_every_repeat_s'])}).",
        "",
        "| ranks / preloaded | first step s (median) | every repeat | warm ranks | vs d |",
        "|---|---|---|---|---|",
    ]
    for key, row in result["b"].items():
        lines.append(f"| {key} | {row['first_step_s']:.2f} | {row['every_repeat_s']} | {row['warm_ranks']} | {row['vs_d']:.2f} |")
    return lines


if __name__ == "__main__":
    main()
