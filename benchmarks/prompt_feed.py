"""``python -m benchmarks.prompt_feed [--quick] [--out DIR]``: the prompt feed next to a driver-side loader.

Three parts, each with rl_data's :class:`~rl_data.prompt_feed.feed.PromptFeed` (2 rank actors
of 0.5 CPU, ``--quick``: 1; calls through actor handles) beside a ``StatefulDataLoader`` over the
same prompts in the driver (2 worker processes), as public RL frameworks feed their rollout
workers (:mod:`benchmarks.prompt_sources`):

1. **throughput**: 1, 4 and 16 concurrent callers (threads), each repeating ``take(k)`` then
   ``ack``: prompts/s over the run and ``take`` latency p50/p99 (the loader's callers share
   its iterator under a lock);
2. **checkpoint with many outstanding prompts**: take 10,000 prompts without resolving any,
   save; a fresh feed restores and hands all 10,000 out again (checked: same uids, in order).
   The loader's ``state_dict``/``load_state_dict`` beside it (its state does not cover the
   outstanding prompts: that is part 3);
3. **accounting under chaos**: :mod:`benchmarks.prompt_chaos`'s seeded async-GRPO scenario
   (oversampling, out-of-order completion, failures, dynamic sampling, two crashes restored
   from checkpoints) against the feed and the loader (two cursor policies): prompts missing
   and duplicated per epoch.

Writes ``prompt_feed.json`` and ``prompt_feed.md`` to ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
FULL = {"prompts": 10_240, "callers": (1, 4, 16), "per_caller_run": 2_000, "take": 4, "outstanding": 10_000,
        "chaos_prompts": 256, "batch_size": 16, "feed_ranks": 2, "scenario": {}}
QUICK = {"prompts": 512, "callers": (1, 4), "per_caller_run": 128, "take": 4, "outstanding": 300,
         "chaos_prompts": 64, "batch_size": 8, "feed_ranks": 1,
         "scenario": {"checkpoint_every": 2, "crash_after_steps": (3, 6)}}
TIMEOUT_S = 600.0


def percentile(values: list[float], q: float) -> float:
    from benchmarks.measure import percentile as nearest_rank

    return nearest_rank(values, q)


def callers_run(take: Any, ack: Any, callers: int, total: int, k: int) -> dict[str, float]:
    """``callers`` threads take ``k`` and ack until ``total`` prompts were taken: rate and take latency."""
    lock, latencies, taken, errors = threading.Lock(), [], [0], []

    def caller() -> None:
        try:
            while True:
                with lock:
                    if taken[0] >= total:
                        return
                started = time.perf_counter()
                prompts = take(k)
                elapsed = time.perf_counter() - started
                ack([p[0] for p in prompts])
                with lock:
                    latencies.append(elapsed)
                    taken[0] += len(prompts)
        except BaseException as error:  # reported below
            errors.append(error)

    started = time.perf_counter()
    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S)
    if errors:
        raise errors[0]
    wall = time.perf_counter() - started
    return {"prompts": taken[0], "seconds": wall, "prompts_per_s": taken[0] / wall,
            "take_p50_ms": 1e3 * percentile(latencies, 50), "take_p99_ms": 1e3 * percentile(latencies, 99)}


def throughput(feed: Any, loader: Any, settings: dict[str, Any], log: Any) -> list[dict[str, Any]]:
    rows = []
    lock = threading.Lock()

    def loader_take(k: int) -> list[Any]:
        with lock:
            return loader.take(k)

    def loader_ack(uids: list[Any]) -> None:
        with lock:
            loader.ack(uids)

    for callers in settings["callers"]:
        total = settings["per_caller_run"] * (1 if callers == 1 else 2)
        ours = callers_run(feed.take, feed.ack, callers, total, settings["take"])
        theirs = callers_run(loader_take, loader_ack, callers, total, settings["take"])
        rows.append({"callers": callers, "feed": ours, "loader": theirs,
                     "rate_ratio": ours["prompts_per_s"] / theirs["prompts_per_s"]})
        log(f"throughput, {callers} callers: feed {ours['prompts_per_s']:.0f}/s (p50 {ours['take_p50_ms']:.1f} ms), "
            f"loader {theirs['prompts_per_s']:.0f}/s (p50 {theirs['take_p50_ms']:.2f} ms)")
    return rows


def checkpoint_with_outstanding(feed: Any, loader: Any, settings: dict[str, Any], work: Path, log: Any) -> dict[str, Any]:
    import io

    import torch

    count = settings["outstanding"]
    started = time.perf_counter()
    held = []
    while len(held) < count:
        held += feed.take(min(500, count - len(held)))
    fill_s = time.perf_counter() - started
    started = time.perf_counter()
    feed.checkpoint(str(work / "outstanding"))
    save_s = time.perf_counter() - started
    size = (work / "outstanding" / "rl_data_state.pt").stat().st_size
    started = time.perf_counter()
    feed.restart(str(work / "outstanding"))  # kill, fresh feed (rank actors, tokenizer), restore
    restart_s = time.perf_counter() - started
    started = time.perf_counter()
    first = feed.take(1)
    first_s = time.perf_counter() - started
    again = first
    while len(again) < count:
        again += feed.take(min(500, count - len(again)))
    all_s = time.perf_counter() - started
    same = [p[0] for p in again] == [p[0] for p in held] and [p[1] for p in again] == [p[1] for p in held]
    feed.ack([p[0] for p in again])

    for _ in range(count // settings["batch_size"]):
        loader.take(settings["batch_size"])
    started = time.perf_counter()
    buffer = io.BytesIO()
    torch.save(loader.loader.state_dict(), buffer)
    loader_save_s = time.perf_counter() - started
    result = {
        "outstanding": count, "feed_fill_s": fill_s, "feed_save_s": save_s, "feed_checkpoint_bytes": size,
        "feed_restart_and_restore_s": restart_s, "feed_first_take_after_restore_s": first_s,
        "feed_rehand_all_s": all_s, "feed_rehanded_same_uids_in_order": same,
        "loader_save_s": loader_save_s, "loader_state_bytes": buffer.getbuffer().nbytes,
        "loader_state_covers_outstanding": False,
    }  # fmt: skip
    log(f"checkpoint with {count} outstanding: feed save {save_s:.3f} s ({size} bytes), restart + restore "
        f"{restart_s:.1f} s, first take {first_s:.3f} s, all again {all_s:.1f} s, same uids in order: {same}")
    return result


def chaos(samples: list[Any], dataset_path: str, tokenizer: Any, settings: dict[str, Any], work: Path, log: Any) -> dict[str, Any]:
    from benchmarks.prompt_chaos import Scenario, account, run_scenario
    from benchmarks.prompt_sources import FeedSource, LoaderSource, PromptDataset

    scenario = Scenario(**settings["scenario"])
    keys = [key for key, _ in samples]
    results = {"scenario": scenario.__dict__ | {"crash_after_steps": list(scenario.crash_after_steps)}, "prompts": len(keys)}
    feed = FeedSource(dataset_path, name="bench-feed-chaos", namespace="rl_data_bench", window=scenario.window,
                      batch_size=settings["batch_size"], timeout_s=TIMEOUT_S, ranks=settings["feed_ranks"])
    try:
        run = run_scenario(feed, scenario, keys, str(work / "chaos-feed"))
    finally:
        feed.close()
    results["feed"] = {**account(run["record"], keys, scenario.epochs), "counts": run["counts"]}
    for cursor in ("latest", "oldest"):
        loader = LoaderSource(PromptDataset(samples, tokenizer), batch_size=settings["batch_size"], num_workers=0,
                              seed=scenario.seed, cursor=cursor)
        run = run_scenario(loader, scenario, keys, str(work / f"chaos-{cursor}"))
        loader.close()
        results[f"loader_{cursor}"] = {**account(run["record"], keys, scenario.epochs), "counts": run["counts"]}
    for name in ("feed", "loader_latest", "loader_oldest"):
        r = results[name]
        log(f"chaos, {name}: {r['missing']} missing, {r['duplicated']} duplicated over {scenario.epochs} epochs "
            f"of {len(keys)} ({r['counts']})")
    return results


def markdown(results: dict[str, Any]) -> str:
    lines = ["# Prompt feed benchmark", "", f"{results['machine']}; {results['prompts']} prompts; "
             f"mode {results['mode']}", "", "## Throughput (take k=4, then ack)", "",
             "| callers | feed prompts/s | feed take p50 / p99 ms | loader prompts/s | loader take p50 / p99 ms | feed / loader |",
             "|---|---|---|---|---|---|"]
    for row in results["throughput"]:
        f, d = row["feed"], row["loader"]
        lines.append(f"| {row['callers']} | {f['prompts_per_s']:.0f} | {f['take_p50_ms']:.1f} / {f['take_p99_ms']:.1f} | "
                     f"{d['prompts_per_s']:.0f} | {d['take_p50_ms']:.2f} / {d['take_p99_ms']:.2f} | {row['rate_ratio']:.2f} |")
    c = results["checkpoint"]
    lines += ["", f"## Checkpoint with {c['outstanding']} outstanding prompts", "",
              "| figure | feed | loader |", "|---|---|---|",
              f"| save s | {c['feed_save_s']:.3f} | {c['loader_save_s']:.4f} |",
              f"| checkpoint bytes | {c['feed_checkpoint_bytes']} | {c['loader_state_bytes']} |",
              f"| crash -> fresh actors restored s | {c['feed_restart_and_restore_s']:.1f} | |",
              f"| first take after restore s | {c['feed_first_take_after_restore_s']:.3f} | |",
              f"| all outstanding handed out again s | {c['feed_rehand_all_s']:.1f} | never (not in its state) |",
              f"| same uids, same order | {c['feed_rehanded_same_uids_in_order']} | |"]
    x = results["chaos"]
    lines += ["", f"## Accounting under chaos ({x['scenario']['epochs']} epochs x {x['prompts']} prompts, crashes after "
              f"steps {x['scenario']['crash_after_steps']})", "",
              "| source | missing | duplicated | taken | released | rolled back |", "|---|---|---|---|---|---|"]
    for name, label in (("feed", "rl_data prompt feed"), ("loader_latest", "StatefulDataLoader, cursor at checkpoint"),
                        ("loader_oldest", "StatefulDataLoader, cursor at oldest unfinished batch")):
        r = x[name]
        lines.append(f"| {label} | {r['missing']} | {r['duplicated']} | {r['counts'].get('taken', 0)} | "
                     f"{r['counts'].get('released', 0)} | {r['counts'].get('rolled_back', 0)} |")
    return "\n".join(lines) + "\n"


def run(*, quick: bool, out: Path, log: Any = print) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import ray
    import torch

    from benchmarks.prompt_sources import FeedSource, LoaderSource, PromptDataset, prompt_samples, write_prompt_dataset
    from rl_data.tokenization.tokenizer import load_qwen3_tokenizer

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(1)
    settings = QUICK if quick else FULL
    tokenizer = load_qwen3_tokenizer()
    with tempfile.TemporaryDirectory(prefix="rl_data_feed_bench_") as tmp:
        work = Path(tmp)
        started = ray.is_initialized()
        if not started:
            ray.init(address="local", num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False,
                     namespace="rl_data_bench", _temp_dir=str(work / "ray"))
        try:
            samples = prompt_samples(settings["prompts"])
            dataset = write_prompt_dataset(work / "prompts", samples)
            chaos_samples = samples[: settings["chaos_prompts"]]
            chaos_dataset = write_prompt_dataset(work / "chaos_prompts", chaos_samples)
            log(f"{len(samples)} prompts written at {dataset}")
            window = settings["outstanding"] + 64
            feed = FeedSource(dataset, name="bench-feed", namespace="rl_data_bench", window=window,
                              batch_size=settings["batch_size"], timeout_s=TIMEOUT_S, ranks=settings["feed_ranks"])
            loader = LoaderSource(PromptDataset(samples, tokenizer), batch_size=settings["batch_size"], num_workers=2, seed=0)
            try:
                results = {
                    "mode": "quick" if quick else "full",
                    "machine": f"{os.cpu_count()} cores",
                    "prompts": len(samples),
                    "throughput": throughput(feed, loader, settings, log),
                    "checkpoint": checkpoint_with_outstanding(feed, loader, settings, work, log),
                }
            finally:
                feed.close()
                loader.close()
            results["chaos"] = chaos(chaos_samples, chaos_dataset, tokenizer, settings, work, log)
        finally:
            if not started:
                ray.shutdown()
    out.mkdir(parents=True, exist_ok=True)
    (out / "prompt_feed.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "prompt_feed.md").write_text(markdown(results))
    log(f"wrote {out / 'prompt_feed.json'} and {out / 'prompt_feed.md'}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prompt_feed", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: checks the benchmark runs, figures not meaningful")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    run(quick=args.quick, out=args.out, log=lambda m: print(m, file=sys.stderr, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
