"""Rewinding a live coordinator beside the workaround it replaces: kill it, start a new one, restore.

``python -m benchmarks.rewind [--ranks 2 4] [--repeats 3] [--conversations 400]`` writes a small
Energon dataset of chitchat conversations (cached in ``$RL_DATA_CACHE``/bench-rewind), starts a
coordinator on a private local Ray, takes ``STEPS`` steps, saves the checkpoint of step 2 and,
per repeat and per way, goes back to it:

* ``rewind``: ``load_state_dict`` on the live coordinator (fresh rank actors in its bundles);
* ``rebuild``: what a Ray Train restart needed before (``shutdown`` + ``ray.kill``, a new
  coordinator of the same name, ``load_state_dict`` into it),

each timed to the first step's batches after it, whose ids must equal the uninterrupted run's
step 3. Prints a markdown table (medians, and rewind / rebuild) and writes ``rewind.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

STEPS = 5
NAME = "bench_rewind"
NAMESPACE = "rl_data_bench"


def _dataset(conversations: int) -> str:
    from rl_data.preprocess.pipeline import PreprocessConfig, run_preprocess
    from rl_data.sample_data import chitchat_conversations

    root = Path(os.environ.get("RL_DATA_CACHE", Path.home() / ".cache" / "rl_data")) / "bench-rewind" / str(conversations)
    if (root / "dataset" / ".nv-meta").is_dir():
        return str(root / "dataset")
    root.mkdir(parents=True, exist_ok=True)
    raw = root / "chat.jsonl"
    raw.write_text("".join(json.dumps(c) + "\n" for c in chitchat_conversations(conversations)))
    run_preprocess(PreprocessConfig(inputs=[str(raw)], output=str(root / "dataset"), target_shard_rows=20,
                                    splits={"train": 1.0}, progress=False, overwrite=True))
    return str(root / "dataset")


def _config(ranks: int, packed: bool, dataset: str) -> tuple[Any, Any]:
    from rl_data.distributed.config import LoaderSpec, ParallelLayout, RuntimeConfig

    energon: dict[str, Any] = {"shuffle_buffer_size": 32}
    extra: dict[str, Any] = {}
    if packed:
        energon["packing_buffer_size"] = 16
        extra["packing_algorithm"] = "first_fit_decreasing"
    spec = LoaderSpec(data_config={"energon": energon, "shuffle": True},
                      source={"path": dataset, "split": "train", "virtual_epoch_length": 50},
                      batch_size=4, max_sequence_length=1024, **extra)
    cpus = 1.0 / ranks
    config = RuntimeConfig(parallel_layout=ParallelLayout(dp=ranks), bundle_resources={"CPU": cpus},
                           rank_actor_num_cpus=cpus, name=NAME, namespace=NAMESPACE,
                           step_timeout_s=300, control_timeout_s=300)
    return config, spec


def _first_step_ids(client: Any) -> list[list[str]]:
    _, refs = client.next_step()
    return [list(client.fetch(ref, "cpu")["source_ids"]) for ref in refs]


def _stop(handle: Any) -> None:
    import ray

    from rl_data.distributed.client import wait_until_name_is_free

    ray.get(handle.shutdown.remote(), timeout=300)
    ray.kill(handle, no_restart=True)
    wait_until_name_is_free(NAME, NAMESPACE, 60)


def measure(ranks: int, packed: bool, repeats: int, dataset: str) -> dict[str, Any]:
    """Median seconds of each way back to step 2, to the first step's batches after it."""
    from rl_data.distributed.client import CoordinatorClient
    from rl_data.distributed.coordinator import start_data_coordinator

    config, spec = _config(ranks, packed, dataset)
    handle = start_data_coordinator(config, spec)
    client = CoordinatorClient(handle, timeout_s=300)
    checkpoint, expected = None, None
    for step in range(1, STEPS + 1):
        ids = _first_step_ids(client)
        client.commit(step)
        if step == 2:
            checkpoint = client.state_dict()
        if step == 3:
            expected = ids
    times: dict[str, list[float]] = {"rewind": [], "rebuild": []}
    exact = True
    for _ in range(repeats):
        client.next_step()  # a pending step and prefetching ranks, as a crashed trainer leaves them
        begin = time.perf_counter()
        client.load_state_dict(checkpoint)
        exact &= _first_step_ids(client) == expected
        times["rewind"].append(time.perf_counter() - begin)
        client.commit(3)
        client.next_step()
        begin = time.perf_counter()
        _stop(handle)
        handle = start_data_coordinator(config, spec)
        client = CoordinatorClient(handle, timeout_s=300)
        client.load_state_dict(checkpoint)
        exact &= _first_step_ids(client) == expected
        times["rebuild"].append(time.perf_counter() - begin)
        client.commit(3)
    _stop(handle)
    rewind, rebuild = statistics.median(times["rewind"]), statistics.median(times["rebuild"])
    return {"ranks": ranks, "packed": packed, "rewind_s": rewind, "rebuild_s": rebuild,
            "rewind_over_rebuild": rewind / rebuild, "exact": exact, "samples": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=400)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    import ray

    # 4 CPU slots on any machine: the ranks take 1 in all, preprocessing's Ray Data tasks the rest
    ray.init(address="local", num_cpus=max(4, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="rl_data_rewind_"))
    load = os.getloadavg()[0]
    try:
        dataset = _dataset(args.conversations)
        rows = [measure(ranks, packed, args.repeats, dataset) for ranks in args.ranks for packed in (False, True)]
    finally:
        ray.shutdown()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "rewind.json").write_text(json.dumps({"load_before": load, "rows": rows}, indent=1))
    print(f"load average before: {load:.2f}; medians of {args.repeats}, to the first step's batches after the restore")
    print("| ranks | packed | rewind (s) | kill + new coordinator + restore (s) | rewind / rebuild | exact |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['ranks']} | {row['packed']} | {row['rewind_s']:.2f} | {row['rebuild_s']:.2f} | "
              f"{row['rewind_over_rebuild']:.2f} | {row['exact']} |")


if __name__ == "__main__":
    main()
