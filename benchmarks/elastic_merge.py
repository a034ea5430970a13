"""``python -m benchmarks.elastic_merge [--quick] [--out DIR]``: the cost of feeding G shards to D < G DP ranks.

G = 8 logical shards (rank actors of 1/8 CPU, 0 Energon workers, batches of 4 real chitchat
conversations, unpacked and packed), fed to D = 1, 2, 4 and 8 DP ranks. With D = G the
coordinator hands out the shard refs as they are; with D < G one small Ray task per DP rank
merges G/D shard batches (:mod:`rl_data.distributed.shard_merge`). Per D: the consumer's time
per step (``next_step`` + fetching every DP rank's batch + ``commit``, in one thread, as a
trainer's driver would), p50 and mean over the measured steps after warm-up, and its ratio to
D = G. Writes ``elastic_merge.json`` and ``elastic_merge.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
SHARDS, DPS = 8, (1, 2, 4, 8)
TIMEOUT_S = 600.0


def _spec(dataset: str, packed: bool) -> Any:
    from rl_data.distributed.config import LoaderSpec

    energon: dict[str, Any] = {"shuffle_buffer_size": 32, "max_samples_per_sequence": 8}
    extra: dict[str, Any] = {}
    if packed:
        energon["packing_buffer_size"] = 8
        extra = {"packing_algorithm": "first_fit_decreasing", "sequence_length_pad_multiple": 8}
    return LoaderSpec(data_config={"energon": energon, "shuffle": True},
                      source={"path": dataset, "split": "train", "virtual_epoch_length": 0},
                      batch_size=4, max_sequence_length=2048, **extra)


def measure(dataset: str, dp: int, packed: bool, steps: int, warmup: int) -> dict[str, Any]:
    import ray

    from rl_data.distributed.client import wait_until_name_is_free
    from rl_data.distributed.config import ParallelLayout, RuntimeConfig
    from rl_data.distributed.coordinator import start_data_coordinator

    config = RuntimeConfig(parallel_layout=ParallelLayout(dp=dp), logical_world_size=SHARDS, prefetch_depth=2,
                           bundle_resources={"CPU": 0.125}, rank_actor_num_cpus=0.125, name=f"bench-elastic-{dp}",
                           namespace="rl_data_bench", step_timeout_s=TIMEOUT_S, control_timeout_s=TIMEOUT_S)
    started = time.perf_counter()
    coordinator = start_data_coordinator(config, _spec(dataset, packed))
    start_s = time.perf_counter() - started
    times, rows = [], 0
    try:
        for index in range(warmup + steps):
            t0 = time.perf_counter()
            step, refs = ray.get(coordinator.next_step.remote(), timeout=TIMEOUT_S)
            batches = ray.get(refs, timeout=TIMEOUT_S)
            ray.get(coordinator.commit.remote(step), timeout=TIMEOUT_S)
            if index >= warmup:
                times.append(time.perf_counter() - t0)
                rows += sum(len(b["source_ids"]) for b in batches)
    finally:
        ray.get(coordinator.shutdown.remote(), timeout=TIMEOUT_S)
        ray.kill(coordinator, no_restart=True)
        wait_until_name_is_free(config.name, config.namespace, TIMEOUT_S)
    return {"dp": dp, "start_s": start_s, "step_p50_ms": 1e3 * statistics.median(times),
            "step_mean_ms": 1e3 * statistics.fmean(times), "rows_per_step": rows / steps}


def markdown(results: dict[str, Any]) -> str:
    lines = ["# Elastic merge benchmark", "", f"{results['machine']}; G = {SHARDS} shards, batches of 4; "
             f"{results['steps']} measured steps after {results['warmup']} warm-up steps", ""]
    for mode, rows in results["modes"].items():
        lines += [f"## {mode}", "", "| D | shards per DP rank | step p50 ms | step mean ms | mean / mean at D = G |",
                  "|---|---|---|---|---|"]
        base = next(r for r in rows if r["dp"] == SHARDS)["step_mean_ms"]
        for r in rows:
            lines.append(f"| {r['dp']} | {SHARDS // r['dp']} | {r['step_p50_ms']:.1f} | {r['step_mean_ms']:.1f} | "
                         f"{r['step_mean_ms'] / base:.2f} |")
        lines.append("")
    return "\n".join(lines)


def run(*, quick: bool, out: Path, log: Any = print) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import ray

    from rl_data.energon.dataset_writer import write_energon_dataset
    from rl_data.energon.sample_format import encode_sample
    from rl_data.sample_data import chitchat_conversations

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    steps, warmup = (5, 2) if quick else (30, 3)
    modes = ("unpacked",) if quick else ("unpacked", "packed")
    with tempfile.TemporaryDirectory(prefix="rl_data_elastic_bench_") as tmp:
        started = ray.is_initialized()
        if not started:
            ray.init(address="local", num_cpus=max(4, os.cpu_count() or 2), include_dashboard=False,
                     namespace="rl_data_bench", _temp_dir=str(Path(tmp) / "ray"))
        try:
            conversations = list(chitchat_conversations())[:2000]
            samples = [(f"chat-{i:05d}", encode_sample({"kind": "sft", "messages": c["messages"], "source": {"row": i}}))
                       for i, c in enumerate(conversations)]
            dataset = str(Path(tmp) / "chat")
            write_energon_dataset(dataset, samples, samples_per_shard=100, splits={"train": 1.0})
            results: dict[str, Any] = {"machine": f"{os.cpu_count()} cores", "steps": steps, "warmup": warmup, "modes": {}}
            for mode in modes:
                rows = []
                for dp in DPS:
                    row = measure(dataset, dp, mode == "packed", steps, warmup)
                    log(f"{mode}, D={dp}: step p50 {row['step_p50_ms']:.1f} ms, mean {row['step_mean_ms']:.1f} ms "
                        f"(start {row['start_s']:.1f} s)")
                    rows.append(row)
                results["modes"][mode] = rows
        finally:
            if not started:
                ray.shutdown()
    out.mkdir(parents=True, exist_ok=True)
    (out / "elastic_merge.json").write_text(json.dumps(results, indent=2))
    (out / "elastic_merge.md").write_text(markdown(results))
    log(f"wrote {out / 'elastic_merge.json'} and {out / 'elastic_merge.md'}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.elastic_merge", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 steps, unpacked only: checks the benchmark runs")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    run(quick=args.quick, out=args.out, log=lambda m: print(m, file=sys.stderr, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
