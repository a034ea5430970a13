"""``python -m benchmarks.adaptive_feed [--prompts 512] [--groups-per-prompt 6] [--out DIR]``: do schedules waste fewer groups?

Two parts:

1. **Schedules side by side.** The GRPO demo's prompts (generated GSM8K-style word problems,
   preprocessed into an ``rl_prompt`` Energon dataset) through a real prompt feed (2 rank actors,
   local Ray), once per schedule: ``uniform`` (every prompt every epoch; DAPO-style dynamic
   sampling drops the groups without reward spread after generating them), ``difficulty_filter``
   and ``prioritized``. The demo's stand-in policy answers each prompt right with a hidden,
   fixed per-prompt probability and samples afresh in every epoch; groups of 4, scored with
   ``math_reward``. Two difficulty mixes (:data:`MIXES`): the demo's (the probability uniform in
   [0, 1]) and a U-shaped one (40 % of the prompts solved almost always, 20 % almost never, 40 %
   uniform in [0.2, 0.8]), closer to what a trained policy meets on its training set. Every run generates the same number of groups (``--prompts``
   x ``--groups-per-prompt``); zero-spread groups are dropped with their outcome, the others
   acked with theirs. Per epoch: groups generated, the share without spread (wasted), samples
   per useful group, prompts the schedule skipped by reason.
2. **History cost.** :class:`~rl_data.prompt_feed.outcomes.PromptHistory` after one outcome per
   prompt for 10k, 100k and 1M prompts: bytes held (numpy arrays, and everything ``tracemalloc``
   sees), checkpoint bytes, microseconds per outcome.

Writes ``adaptive_feed.json``, ``adaptive_feed.md`` and ``adaptive_feed.png`` to ``--out``
(default ``benchmarks/results``). ~4 minutes on 2 cores with the defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
TIMEOUT_S = 300.0
GROUP_SIZE = 4
#: The feed's window and the prompts taken per call.
WINDOW, TAKE = 64, 16
SCHEDULES: dict[str, dict[str, Any]] = {
    "uniform": {},
    "difficulty_filter": {"name": "difficulty_filter", "options": {"retire_after": 1, "defer_after": 1, "defer_for": 4, "max_defer": 16}},
    "prioritized": {"name": "prioritized", "options": {"weight": "variance", "floor": 0.1}},
}
HISTORY_SIZES = (10_000, 100_000, 1_000_000)
#: Difficulty mixes: the hidden chance of a right sample per prompt.
MIXES = {
    "uniform difficulty": "p uniform in [0, 1] (the GRPO demo's stand-in)",
    "U-shaped difficulty": "40 % p=0.97, 20 % p=0.02, 40 % p uniform in [0.2, 0.8]",
}


def policy_for(mix: str) -> Any:
    from dataclasses import dataclass

    from rl_data.jobs.grpo.policy import StandInPolicy, hashed_unit

    @dataclass(frozen=True)
    class UShapedPolicy(StandInPolicy):
        def correct_probability(self, key: str) -> float:
            u = hashed_unit(self.seed, "mix", key)
            return 0.97 if u < 0.4 else 0.02 if u < 0.6 else 0.2 + 0.6 * hashed_unit(self.seed, "p", key)

    cls = StandInPolicy if mix == "uniform difficulty" else UShapedPolicy
    return cls(seed=0, group_size=GROUP_SIZE)


def run_schedule(name: str, mix: str, demo: Any, budget: int, log: Any) -> dict[str, Any]:
    """One feed with schedule ``name`` over difficulty ``mix``: generate ``budget`` groups; per-epoch rows and totals."""
    import ray

    from rl_data.prompt_feed.client import attach_feed
    from rl_data.prompt_feed.feed import FeedConfig, start_prompt_feed
    from rl_data.prompt_feed.outcomes import Outcome
    from rl_data.prompt_feed.schedules import ScheduleConfig
    from rl_data.rewards import math_reward

    config = demo.runtime_config().model_copy(update={"name": f"adaptive-{name}-{uuid.uuid4().hex[:6]}"})
    feed_config = FeedConfig(max_outstanding=WINDOW, schedule=ScheduleConfig(**SCHEDULES[name]), kept_epochs=1000)  # per-epoch status
    handle = start_prompt_feed(config, demo.loader_spec(), feed_config)
    policy = policy_for(mix)
    epochs: dict[int, dict[str, int]] = defaultdict(lambda: {"groups": 0, "zero_spread": 0, "samples": 0})
    generated, started = 0, time.perf_counter()
    try:
        rollout, trainer = attach_feed(config.name, config.namespace, timeout_s=TIMEOUT_S)
        while generated < budget:
            prompts = rollout.take(min(TAKE, budget - generated))
            useful, wasted = [], []
            for prompt in prompts:
                truth = str(prompt.payload["extra_env_info"]["ground_truth"])
                rewards = [math_reward(r, truth) for r in policy.responses(prompt.key, truth, attempt=prompt.uid[0])]
                outcome = Outcome.from_rewards(rewards, correct_at=1.0)
                row = epochs[prompt.uid[0]]
                row["groups"] += 1
                row["samples"] += outcome.samples
                row["zero_spread"] += int(outcome.zero_spread)
                (wasted if outcome.zero_spread else useful).append((prompt.uid, outcome))
            if wasted:
                trainer.drop([u for u, _ in wasted], "zero_spread", outcomes=[o for _, o in wasted])
            if useful:
                trainer.ack([u for u, _ in useful], outcomes=[o for _, o in useful])
            generated += len(prompts)
        status = rollout.status()
    finally:
        ray.get(handle.shutdown.remote(), timeout=TIMEOUT_S)
        ray.kill(handle, no_restart=True)
    skipped = {e["epoch"]: e["skipped"] for e in status["epochs"]}
    rows = []
    for epoch, row in sorted(epochs.items()):
        useful = row["groups"] - row["zero_spread"]
        rows.append({
            "epoch": epoch, **row, "zero_spread_share": row["zero_spread"] / row["groups"],
            "samples_per_useful_group": row["samples"] / useful if useful else None, "skipped": skipped.get(epoch, {}),
        })  # fmt: skip
    later = [r for r in rows if r["epoch"] >= 1]
    later_groups = sum(r["groups"] for r in later)
    later_wasted = sum(r["zero_spread"] for r in later)
    result = {
        "schedule": name, "options": SCHEDULES[name], "groups": generated, "seconds": time.perf_counter() - started,
        "epochs": rows, "history": status["history"], "skipped": status["skipped"],
        "zero_spread_share_from_epoch_1": later_wasted / later_groups if later_groups else None,
        "samples_per_useful_group_from_epoch_1": (
            GROUP_SIZE * later_groups / (later_groups - later_wasted) if later_groups > later_wasted else None
        ),
    }  # fmt: skip
    log(f"{mix}, {name}: {generated} groups over {len(rows)} epochs in {result['seconds']:.0f} s; zero-spread share from "
        f"epoch 1: {result['zero_spread_share_from_epoch_1']:.3f}")  # fmt: skip
    return result


def history_cost(sizes: tuple[int, ...] = HISTORY_SIZES) -> list[dict[str, Any]]:
    """Memory and checkpoint bytes of a PromptHistory holding one outcome for each of ``n`` prompts."""
    from rl_data.prompt_feed.outcomes import Outcome, PromptHistory

    rows = []
    outcomes = [Outcome(GROUP_SIZE, correct=c) for c in range(GROUP_SIZE + 1)]
    for n in sizes:
        tracemalloc.start()
        history = PromptHistory()
        started = time.perf_counter()
        for i in range(n):
            history.observe(f"gsm8k-train/{i:07d}", outcomes[i % len(outcomes)])
        seconds = time.perf_counter() - started
        state = history.state()
        traced, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        checkpoint = sum(len(v) for v in state.values())
        rows.append({
            "prompts": n, "array_bytes_per_prompt": history.nbytes / n, "traced_bytes_per_prompt": (traced - checkpoint) / n,
            "checkpoint_bytes_per_prompt": checkpoint / n, "us_per_outcome": 1e6 * seconds / n,
        })  # fmt: skip
        del history, state
    return rows


def write_reports(results: dict[str, Any], out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "adaptive_feed.json", "md": out / "adaptive_feed.md", "png": out / "adaptive_feed.png"}
    paths["json"].write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "# Adaptive prompt schedules",
        "",
        f"{results['prompts']} prompts, {results['budget']} groups of {GROUP_SIZE} per schedule; stand-in policy with a hidden "
        "per-prompt chance of a right answer, a fresh group every epoch; zero-spread groups dropped.",
    ]
    for mix, runs in results["mixes"].items():
        base = runs[0]["zero_spread_share_from_epoch_1"]
        lines += [
            "", f"## {mix}: {MIXES[mix]}", "",
            "| schedule | zero-spread share, epoch 1 on | fewer wasted groups than uniform | samples per useful group, epoch 1 on | skipped (all epochs) |",
            "|---|---|---|---|---|",
        ]  # fmt: skip
        for run in runs:
            share = run["zero_spread_share_from_epoch_1"]
            lines.append(f"| {run['schedule']} | {share:.3f} | {base / share:.2f}x | "
                         f"{run['samples_per_useful_group_from_epoch_1']:.2f} | {run['skipped'] or '-'} |")  # fmt: skip
        width = max(len(r["epochs"]) for r in runs)
        lines += ["", "Per epoch (groups generated / zero-spread share / samples per useful group):", ""]
        lines += ["| schedule | " + " | ".join(f"epoch {e}" for e in range(width)) + " |", "|---|" + "---|" * width]
        for run in runs:
            cells = [f"{r['groups']} / {r['zero_spread_share']:.2f} / {r['samples_per_useful_group'] or 0:.1f}" for r in run["epochs"]]
            lines.append(f"| {run['schedule']} | " + " | ".join(cells) + " |")
    lines += ["", "History cost (one outcome per prompt):", "",
              "| prompts | array bytes / prompt | traced bytes / prompt | checkpoint bytes / prompt | us per outcome |",
              "|---|---|---|---|---|"]  # fmt: skip
    for row in results["history_cost"]:
        lines.append(f"| {row['prompts']:,} | {row['array_bytes_per_prompt']:.1f} | {row['traced_bytes_per_prompt']:.1f} | "
                     f"{row['checkpoint_bytes_per_prompt']:.1f} | {row['us_per_outcome']:.1f} |")  # fmt: skip
    paths["md"].write_text("\n".join(lines) + "\n")
    plot(results, paths["png"])
    return paths


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mixes = results["mixes"]
    fig, axes = plt.subplots(len(mixes), 2, figsize=(11, 4 * len(mixes)), squeeze=False)
    for (share, cost), (mix, runs) in zip(axes, mixes.items()):
        for run in runs:
            epochs = [r["epoch"] for r in run["epochs"]]
            share.plot(epochs, [r["zero_spread_share"] for r in run["epochs"]], marker="o", label=run["schedule"])
            cost.plot(epochs, [r["samples_per_useful_group"] for r in run["epochs"]], marker="o", label=run["schedule"])
        share.set(xlabel="epoch", ylabel="zero-spread groups / groups generated", title=f"Wasted groups ({mix})")
        cost.set(xlabel="epoch", ylabel="samples per useful group", title=f"Generation cost ({mix})")
        share.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.adaptive_feed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=512, help="generated word problems (a multiple of 16)")
    parser.add_argument("--groups-per-prompt", type=float, default=6.0, help="groups generated per schedule, per prompt")
    parser.add_argument("--history-sizes", type=int, nargs="*", default=list(HISTORY_SIZES))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import ray
    from rich.console import Console

    from rl_data.jobs.grpo.config import GRPODemoConfig
    from rl_data.jobs.grpo.demo import _prepare_prompts

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    work = Path(tempfile.mkdtemp(prefix="adaptive_feed_"))
    demo = GRPODemoConfig(num_prompts=args.prompts, work_dir=str(work), namespace="rl_data_adaptive_bench")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, namespace=demo.namespace)
    try:
        _prepare_prompts(demo, Console(stderr=True))
        budget = int(args.prompts * args.groups_per_prompt)
        mixes = {mix: [run_schedule(name, mix, demo, budget, log) for name in SCHEDULES] for mix in MIXES}
    finally:
        ray.shutdown()
    results = {"prompts": args.prompts, "budget": budget, "mixes": mixes, "history_cost": history_cost(tuple(args.history_sizes))}
    for kind, path in write_reports(results, args.out).items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
