"""Where a rank actor's CPU goes beside its loader thread, and b(1) against a (issue 37 §2).

```bash
python -m benchmarks.rank_share [--packed] [--rounds 2] [--samples 12000] [--window-s 8] [--profile] [--hand-over 3]
```

Per round, interleaved: contender a (the loader in one fresh process) and b(1) (one rank actor,
the coordinator, the consumer actor; ``benchmarks.rl_data_actors``), each ``--samples`` samples;
their steady rates (from the first batch) and the ratio b(1) / a of the same round. During b(1)'s
steady state (after ``--warm-batches`` batches handed out), the rank process's CPU per thread over
``--window-s`` seconds from ``/proc`` (exact ticks, every thread, Ray's C++ ones too): the loader
thread's share and the rest, *Ray's share*. With ``--profile``, py-spy samples the rank's Python
threads over the same window (``record --threads --nonblocking``, on-CPU samples only), classified
by :func:`classify`; py-spy's own CPU then slows that round, so judge rates on rounds without it.
``--hand-over N``: N repeats of :func:`hand_over_cost` with a real batch and state of the mode.
The machine's load (``os.getloadavg``) is recorded before and after each run.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

PY_SPY = str(Path(sys.executable).with_name("py-spy"))
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: py-spy categories, first match wins: (name, substrings of a frame on the sample's stack).
CATEGORIES = (
    ("state (in the loader thread)", ("state_dict_deferring", "EnergonSFTDataLoader.state_dict", "encode_rank_state")),
    ("production (loader thread)", ("_produce_one",)),
    ("serialisation of the reply", ("serializ", "_encode_batched_data_dict", "__reduce__", "pickle", "store_task_output")),
    ("state hand-out (complete_state, state_dict)", ("complete_state", "RankActor.state_dict")),
    ("metrics", ("record_handed_out", "record_produced", "metrics")),
    ("next_batch / rank bookkeeping", ("next_batch", "next_batches", "_count_zero_loss", "_produce_forever")),
    ("Ray call handling / event loop", ("",)),
)


def classify(stack: str) -> str:
    """The category of one py-spy stack (``frame;frame;...``, outermost first)."""
    for name, needles in CATEGORIES:
        if any(needle in stack for needle in needles):
            return name
    raise AssertionError("the last category matches every stack")


def thread_ticks(pid: int) -> dict[int, tuple[str, int]]:
    """Every thread of ``pid``: tid -> (name, user + system clock ticks so far)."""
    ticks = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            name = (task / "comm").read_text().strip()
        except OSError:  # the thread ended
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks[int(task.name)] = (name, int(fields[11]) + int(fields[12]))
    return ticks


def profile_window(pid: int, seconds: float, profile: bool, out: Path) -> dict[str, Any]:
    """CPU per thread of ``pid`` over ``seconds`` (and py-spy's samples with ``profile``)."""
    load_before, before, started = os.getloadavg(), thread_ticks(pid), time.monotonic()
    if profile:
        subprocess.run(
            [PY_SPY, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "250", "-f", "raw", "--threads",
             "--nonblocking", "-o", str(out)],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=seconds + 60,
        )  # fmt: skip
    else:
        time.sleep(seconds)
    elapsed, after = time.monotonic() - started, thread_ticks(pid)
    per_thread = {tid: (name, (ticks - before.get(tid, (name, 0))[1]) / CLOCK_TICKS) for tid, (name, ticks) in after.items()}
    samples = _py_spy_threads(out) if profile else {}
    loader_tid = max(per_thread, key=lambda tid: per_thread[tid][1])  # the busiest thread is the loader's
    total = sum(cpu for _, cpu in per_thread.values())
    loader = per_thread[loader_tid][1]
    threads = sorted(((cpu, tid, name) for tid, (name, cpu) in per_thread.items() if cpu > 0), reverse=True)
    return {
        "window_s": elapsed,
        "process_cores": total / elapsed,
        "loader_thread_share": loader / total,
        "ray_share": 1 - loader / total,
        "threads": [
            {"tid": tid, "name": name, "cpu_share": cpu / total} for cpu, tid, name in threads[:8]
        ],
        "py_spy": _categories(samples) if profile else None,
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }


def _py_spy_threads(path: Path) -> dict[int, tuple[str, collections.Counter]]:
    """py-spy's raw output per thread id: (thread name, stack -> samples)."""
    threads: dict[int, tuple[str, collections.Counter]] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        head, _, frames = stack.partition(";")
        tid, _, name = head.removeprefix("thread (").partition(")")
        threads.setdefault(int(tid, 0), (name.removeprefix(": ") or f"thread {tid}", collections.Counter()))[1][frames] += int(count)
    return threads


def _categories(threads: dict[int, tuple[str, collections.Counter]]) -> dict[str, float]:
    """Share of the Python threads' on-CPU samples per category."""
    shares: collections.Counter = collections.Counter()
    for _name, stacks in threads.values():
        for stack, count in stacks.items():
            shares[classify(stack)] += count
    total = sum(shares.values()) or 1
    return {name: shares[name] / total for name, _ in CATEGORIES}


def _sample(workload: Any, settings: Any, packing: bool) -> tuple[Any, dict[str, Any]]:
    """A steady-state batch of contender b's loader and the (deferred) state after it."""
    from benchmarks.energon_bare import loader_kwargs
    from rl_data.distributed.config import LoaderSpec
    from rl_data.energon.sft_dataloader import build_loader

    kwargs = loader_kwargs(workload, settings, packing=packing)
    topology = {key: kwargs.pop(key) for key in ("logical_rank", "logical_world_size", "placement_fingerprint")}
    spec = LoaderSpec(**kwargs)
    loader = build_loader(spec, spec.load_processor_factory()(), **topology)
    batches = iter(loader)
    for _ in range(20):
        batch = next(batches)
    state = loader.state_dict_deferring()[0]
    loader.close()
    return batch, state


def _watch_rank(packing: bool, warm_batches: int, seconds: float, profile: bool, out: Path, found: dict) -> None:
    """Find b(1)'s rank actor once it handed out ``warm_batches`` batches; measure its window."""
    import ray

    from benchmarks.rl_data_actors import NAMESPACE

    prefix, deadline = f"bench-1-0-{int(packing)}-", time.monotonic() + 300
    while time.monotonic() < deadline:
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE]
        names = [name for name in names if name.startswith(prefix) and name not in found.get("seen", ())]
        if names:
            coordinator = ray.get_actor(names[0], namespace=NAMESPACE)
            rank = ray.get(coordinator.status.remote(), timeout=120)["ranks"][0]
            while rank.get("handed_out", 0) < warm_batches and time.monotonic() < deadline:
                time.sleep(0.2)
                rank = ray.get(coordinator.status.remote(), timeout=60)["ranks"][0]
            found["window"] = profile_window(rank["pid"], seconds, profile, out)
            found.setdefault("seen", []).append(names[0])
            return
        time.sleep(0.2)


def hand_over_cost(batch: Any, state: dict[str, Any], batches: int = 240) -> dict[str, Any]:
    """CPU per batch of Ray's hand-over alone (Ray must be initialised): an async actor holding
    ``batch`` and ``state`` answers ``next_batch`` (a rank's: one call, two objects per batch) or
    ``next_batches`` (several steps per call, tried and not kept: n batches and one state object
    per call, plus a liveness call for each of the n - 1 steps a coordinator would serve from what
    it holds), called as the coordinator calls a rank; CPU of
    the actor's process (``/proc``) and of the caller (``process_time``), in ms per batch."""
    import ray

    @ray.remote(num_cpus=0)
    class Rank:
        def pid(self) -> int:
            return os.getpid()

        @ray.method(num_returns=2)
        async def next_batch(self) -> tuple[Any, dict[str, Any]]:
            return batch, dict(state)

        async def next_batches(self, most: int) -> tuple[Any, ...]:
            return (*[batch] * most, ([dict(state)] * most, 0))

    rank = Rank.remote()
    pid = ray.get(rank.pid.remote(), timeout=120)
    process_cpu = lambda: sum(ticks for _, ticks in thread_ticks(pid).values()) / CLOCK_TICKS
    result = {}
    for per_call in (0, 1, 2, 3):
        rank_cpu, caller_cpu = process_cpu(), time.process_time()
        for _ in range(batches // max(per_call, 1)):
            if per_call:
                ray.get(rank.next_batches.options(num_returns=per_call + 1).remote(per_call)[-1], timeout=120)
                for _ in range(per_call - 1):  # the coordinator's liveness check per step taken from its buffer
                    ray.get(rank.pid.remote(), timeout=120)
            else:
                ray.get(rank.next_batch.remote()[1], timeout=120)
        name = f"next_batches, {per_call} per call" if per_call else "next_batch"
        result[name] = {
            "rank_ms": 1e3 * (process_cpu() - rank_cpu) / batches,
            "caller_ms": 1e3 * (time.process_time() - caller_cpu) / batches,
            "load": os.getloadavg()[0],
        }
    ray.kill(rank)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rank_share", description=__doc__.split("\n")[0])
    parser.add_argument("--packed", action="store_true")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--samples", type=int, default=12_000)
    parser.add_argument("--window-s", type=float, default=8.0)
    parser.add_argument("--warm-batches", type=int, default=40)
    parser.add_argument("--profile", action="store_true", help="py-spy the rank in an extra b(1) run after the rounds")
    parser.add_argument("--hand-over", type=int, default=0, metavar="REPEATS", help="also time Ray's hand-over alone")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)

    import ray
    import torch

    from benchmarks import rl_data_actors
    from benchmarks.fresh_process import run_in_fresh_process
    from benchmarks.settings import BenchSettings
    from benchmarks.suite import REPO_ROOT
    from benchmarks.workload import prepare_workload

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    torch.set_num_threads(1)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    settings = BenchSettings(samples_per_run=args.samples, wait_steps=3)
    workload = prepare_workload(settings, args.out / "cache")
    mode = "packed" if args.packed else "unpacked"
    ray_dir = tempfile.mkdtemp(prefix="rl_data_rank_share_ray_")
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             configure_logging=False, _temp_dir=ray_dir)  # fmt: skip
    rounds, found = [], {}
    try:
        runs = [False] * args.rounds + ([True] if args.profile else [])
        for index, profile in enumerate(runs):
            row: dict[str, Any] = {"round": index + 1, "profiled": profile}
            if not profile:
                row["load_before_a"] = os.getloadavg()
                a = run_in_fresh_process("a", workload, settings, packing=args.packed)
                row["a_steady_tok_s"] = a["steady_non_pad_tokens_per_s"]
            out = args.out / f"rank_share_{mode}_round{index + 1}.pyspy.txt"
            watcher = threading.Thread(
                target=_watch_rank, args=(args.packed, args.warm_batches, args.window_s, profile, out, found), daemon=True
            )
            row["load_before_b"] = os.getloadavg()
            watcher.start()
            b = rl_data_actors.run(workload, settings, packing=args.packed, ranks=1, restore=False)
            watcher.join(timeout=120)
            row["b1_steady_tok_s"] = b["steady_non_pad_tokens_per_s"]
            row["load_after"] = os.getloadavg()
            if "a_steady_tok_s" in row:
                row["b1_over_a"] = row["b1_steady_tok_s"] / row["a_steady_tok_s"]
            row["rank"] = found.pop("window", None)
            rounds.append(row)
            print(json.dumps(row), flush=True)
        if args.hand_over:
            batch, state = _sample(workload, settings, args.packed)
            for _ in range(args.hand_over):
                rounds.append({"hand_over": hand_over_cost(batch, state)})
                print(json.dumps(rounds[-1]), flush=True)
    finally:
        ray.shutdown()
        shutil.rmtree(ray_dir, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank_share_{mode}.json").write_text(json.dumps(rounds, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
