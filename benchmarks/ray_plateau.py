"""``python -m benchmarks.ray_plateau [--minutes 45] [--every 5000] [--out DIR]``: where does Ray's per-call memory stop growing?

A Ray actor's anonymous memory grows with the calls it receives and makes until Ray's own buffers
fill, then stays flat. The soak (:mod:`benchmarks.soak`) on this machine runs ~10-20k steps in 30
minutes under its faults: inside that warm-up. This run shows the whole curve without faults or
data: a coordinator with 2 synthetic ranks (the consumer loop users write: ``next_step``, fetch,
``commit``) and a feed with 1 synthetic rank over 10 M prompts (``take(4)``, ``ack``: no epoch
ends), one of each per loop step, as fast as they go. Every ``--every`` steps it samples the
anonymous memory (``rss - shared``) of the coordinator, the feed, the ranks and the driver, and the
objects in the coordinator's Ray store; it prints the slope over each quarter of the run, in MB
per 1,000 steps.

Writes ``ray_plateau.json``, ``ray_plateau.md`` and ``ray_plateau.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
TIMEOUT_S = 120.0
NAMESPACE = "rl_data_ray_plateau"


def start(ray: Any) -> tuple[Any, Any, dict[str, int]]:
    """The coordinator's client, the feed's rollout client and every process id to sample."""
    from rl_data.distributed.client import CoordinatorClient
    from rl_data.distributed.config import ParallelLayout, RuntimeConfig
    from rl_data.distributed.coordinator import start_data_coordinator
    from rl_data.prompt_feed.client import RolloutClient
    from rl_data.prompt_feed.feed import FeedConfig, start_prompt_feed
    from rl_data.tasks.synthetic import synthetic_loader_spec

    common = dict(namespace=NAMESPACE, step_timeout_s=TIMEOUT_S, control_timeout_s=TIMEOUT_S,
                  bundle_resources={"CPU": 0.25}, rank_actor_num_cpus=0.25)  # fmt: skip
    coordinator = start_data_coordinator(
        RuntimeConfig(parallel_layout=ParallelLayout(dp=2), prefetch_depth=2, name="plateau_coordinator", **common),
        synthetic_loader_spec(batch_size=4, samples_per_rank=100_000, tokens_per_sample=64, name="plateau-steps"),
    )
    feed = start_prompt_feed(
        RuntimeConfig(parallel_layout=ParallelLayout(dp=1), name="plateau_feed", **common),
        synthetic_loader_spec(batch_size=8, samples_per_rank=10_000_000, tokens_per_sample=64, name="plateau-prompts"),
        FeedConfig(max_outstanding=64),
    )
    client = CoordinatorClient(coordinator, timeout_s=TIMEOUT_S)
    status = client.status()
    pids = {"coordinator": status["pid"], "feed": ray.get(feed.status.remote(), timeout=TIMEOUT_S)["pid"], "driver": os.getpid()}
    pids.update({f"coordinator rank {r['rank']}": r["pid"] for r in status["ranks"]})
    return client, RolloutClient(feed, timeout_s=TIMEOUT_S), pids


def anonymous_mb(pids: dict[str, int]) -> dict[str, float]:
    import psutil

    memory = {}
    for name, pid in pids.items():
        info = psutil.Process(pid).memory_info()
        memory[name] = (info.rss - info.shared) / 2**20
    return memory


def quarter_slopes(rows: list[dict[str, Any]], name: str) -> list[float | None]:
    """The least-squares slope of ``name`` over each quarter of the run's samples, MB per 1,000 steps."""
    slopes: list[float | None] = []
    for q in range(4):
        part = rows[q * len(rows) // 4 : (q + 1) * len(rows) // 4 + 1]
        if len(part) < 2:
            slopes.append(None)
            continue
        fit = statistics.linear_regression([r["step"] for r in part], [r["anon_mb"][name] for r in part])
        slopes.append(1000.0 * fit.slope)
    return slopes


def run(minutes: float, every: int, log: Any) -> dict[str, Any]:
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, namespace=NAMESPACE)
    try:
        client, rollout, pids = start(ray)
        rows, step, started = [], 0, time.monotonic()
        while time.monotonic() - started < 60 * minutes:
            handed, refs = client.next_step()
            ray.get(refs, timeout=TIMEOUT_S)
            client.commit(handed)
            rollout.ack([prompt.uid for prompt in rollout.take(4)])
            step += 1
            if step % every == 0:
                rows.append({"step": step, "seconds": time.monotonic() - started, "anon_mb": anonymous_mb(pids),
                             "coordinator_objects": client.status()["objects_in_memory"]})  # fmt: skip
                log(f"step {step}: " + ", ".join(f"{k} {v:.2f}" for k, v in rows[-1]["anon_mb"].items()))
    finally:
        ray.shutdown()
    slopes = {name: quarter_slopes(rows, name) for name in pids}
    return {"minutes": minutes, "steps": step, "every": every, "rows": rows, "quarter_slopes": slopes}


def markdown(results: dict[str, Any]) -> str:
    rows = results["rows"]
    lines = [
        "# Ray's per-call memory: coordinator and feed over synthetic ranks",
        "",
        f"{results['steps']:,} loop steps in {results['minutes']:g} minutes; anonymous memory (MB) and the slope "
        "over each quarter of the run (MB per 1,000 steps).",
        "",
        "| process | first sample | last sample | slope Q1 | Q2 | Q3 | Q4 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, slopes in results["quarter_slopes"].items():
        cells = " | ".join("-" if s is None else f"{s:.3f}" for s in slopes)
        lines.append(f"| {name} | {rows[0]['anon_mb'][name]:.2f} | {rows[-1]['anon_mb'][name]:.2f} | {cells} |")
    objects = [r["coordinator_objects"] for r in rows]
    lines += ["", f"Objects in the coordinator's store: {min(objects)} to {max(objects)}."]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    fig, ax = plt.subplots(figsize=(9, 4))
    for name in results["quarter_slopes"]:
        base = rows[0]["anon_mb"][name]
        ax.plot([r["step"] for r in rows], [r["anon_mb"][name] - base for r in rows], marker=".", label=name)
    ax.set(xlabel="loop steps", ylabel="anonymous memory - first sample (MB)", title="Ray's per-call memory")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ray_plateau", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=45.0, help="how long the loop runs")
    parser.add_argument("--every", type=int, default=5000, help="loop steps between two samples")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    results = run(args.minutes, args.every, lambda message: print(message, file=sys.stderr, flush=True))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ray_plateau.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "ray_plateau.md").write_text(markdown(results))
    plot(results, args.out / "ray_plateau.png")
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
