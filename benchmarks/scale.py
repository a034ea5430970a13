"""``python -m benchmarks.scale [--quick] [--out DIR]``: the runtime's cost per logical shard and per feed caller.

Issue 37's scale curve. The real ``DataCoordinator``, ``RankPool``, ``RankActor``, checkpoint files
and ``PromptFeed`` run over the synthetic task (:mod:`rl_data.tasks.synthetic`: no Energon, no
tokenizer, no torch in the rank processes), so G = 128 rank actors fit on one small machine. Each
G runs in its own private local Ray (fresh ``ray.init``; ``--quick``: one Ray for every part):

* **start-up**: ``start_data_coordinator`` until every rank's loader is ready;
* **hand-out**: ``next_step(commit=k-1)`` round trips from the driver (a trainer's one call per
  step), with a simulated training step of ``train_s_per_rank * G`` seconds between steps so the
  ranks prefetch; the coordinator process's CPU per step (psutil, all threads, idle rate
  subtracted) and the ranks' CPU per step;
* **checkpoint**: ``save_checkpoint`` (gather every rank's state, checksum, ``torch.save``, fsync)
  and the file's size;
* **restore**: ``load_checkpoint`` into the live coordinator (a rewind, a step pending), then the
  first step; and into a fresh coordinator (after a second start-up);
* **dead rank**: ``ray.kill`` of one rank actor, then the next ``next_step`` (replacement, restore,
  re-production of the pending step); the steps after it are checked by sample id;
* memory of the coordinator and of every rank process.

The feed (its own Ray; ``feed_ranks`` synthetic rank actors, prompts of ``prompt_tokens`` int32 ids):

* **callers**: 1, 16, 64, 256 concurrent callers, closed loop (``take(take_n)`` then ``ack``, no
  pause), as asyncio tasks spread over ``caller_hosts`` caller actors (separate processes, real
  Ray calls to the feed actor): latency p50/p99 of each call and calls per second;
* **outstanding**: take without resolving until 1,000 / 10,000 / 100,000 prompts are out: the feed
  process's RSS, ``save_checkpoint`` time and size, a ``take(1)`` + ``ack`` round trip; then half of
  the 100,000 acked out of order (every other uid: resolved uids above the low-water mark).

Bare-Ray contenders (:mod:`benchmarks.bare_ray`), same run: after each G, the same one call per rank
per step with nothing of rl_data around it; after the feed's levels, a feed that does nothing, in
the same closed loop. Their figures are this machine's floor for each call pattern (``rl_data / bare``).

Each curve gets a least-squares line (per rank / per caller / per prompt cost) and the ratio of
its slope over the upper half of the range to the slope over the lower half (1 = linear, > 1 =
grows faster than linearly). Writes ``scale.json``, ``scale.md`` and ``scale.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results"
FULL = {
    "shards": (8, 32, 128), "steps": 30, "warmup": 4, "train_s_per_rank": 0.01, "repeats": 3,
    "batch_size": 8, "tokens": 4096, "state_bytes": 40_000, "samples_per_rank": 4096, "rank_cpu": 1 / 32, "ray_cpus": 8,
    "callers": (1, 16, 64, 256), "takes_per_level": 1200, "take_n": 4, "caller_hosts": 4, "pace_s": 2.0, "paced_rounds": 5,
    "feed_ranks": 4, "prompt_tokens": 256, "feed_batch": 256, "outstanding": (1_000, 10_000, 100_000),
    "idle_s": 3.0, "one_ray": False,
}  # fmt: skip
QUICK = {
    **FULL, "shards": (1, 2), "steps": 4, "warmup": 1, "repeats": 1, "samples_per_rank": 256,
    "callers": (1, 4), "takes_per_level": 40, "caller_hosts": 1, "pace_s": 0.2, "paced_rounds": 3, "feed_ranks": 2, "feed_batch": 64,
    "outstanding": (200, 800), "idle_s": 1.0, "one_ray": True,
}  # fmt: skip
TIMEOUT_S = 900.0
NAMESPACE = "rl_data_scale"
EXTRAPOLATE_TO = 1024


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def percentile(values: list[float], q: float) -> float:
    from benchmarks.measure import percentile as nearest_rank

    return nearest_rank(values, q)


def linear_fit(xs: list[float], ys: list[float]) -> dict[str, float]:
    """Least squares ``y = fixed + per_unit * x``; ``slope_ratio``: the slope over the upper half of
    the range (last two points) / over the lower half (first two); ``at_1024``: the line at x = 1,024."""
    n, mean_x, mean_y = len(xs), statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / var if n > 1 and var else 0.0
    fixed = mean_y - slope * mean_x
    low = (ys[1] - ys[0]) / (xs[1] - xs[0]) if n > 1 else 0.0
    high = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if n > 1 else 0.0
    return {
        "per_unit": slope, "fixed": fixed, "slope_ratio": high / low if low > 0 else float("nan"),
        "at_1024": fixed + slope * EXTRAPOLATE_TO,
    }  # fmt: skip


@contextlib.contextmanager
def private_ray(num_cpus: int, tmp: Path):
    """A private local Ray for one measurement (its own session folder under ``tmp``), or the one
    already running (``one_ray``: every measurement in one); its workers import ``benchmarks`` (the
    caller hosts) through the inherited ``PYTHONPATH``, not a runtime_env (which would start every
    worker without a prestarted process)."""
    import ray

    if ray.is_initialized():
        yield ray
        return
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False,
             namespace=NAMESPACE, _temp_dir=tempfile.mkdtemp(prefix="ray_", dir=tmp))  # fmt: skip
    try:
        yield ray
    finally:
        ray.shutdown()


def cpu_seconds(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def memory_mb(pid: int) -> dict[str, float]:
    import psutil

    info = psutil.Process(pid).memory_full_info()
    return {"rss_mb": info.rss / 2**20, "uss_mb": info.uss / 2**20}


def expected_ids(spec: Any, world: int, placement_fingerprint: str, steps: list[int]) -> dict[int, list[list[str]]]:
    """``{step: [rank] -> sample ids}`` of an uninterrupted run, read from the synthetic loaders directly."""
    from rl_data.distributed.rank_actor import loader_builder
    from rl_data.tasks.synthetic import load_stub_tokenizer

    last, found = max(steps), {step: [] for step in steps}
    for rank in range(world):
        loader = loader_builder(spec)(spec, load_stub_tokenizer(), logical_rank=rank, logical_world_size=world,
                                       placement_fingerprint=placement_fingerprint)  # fmt: skip
        batches: list[list[str]] = []
        while len(batches) < last:
            batches += [batch["source_ids"] for batch in loader]
        for step in steps:
            found[step].append(batches[step - 1])
    return found


def measure_handout(next_step: Any, coordinator_pid: int, rank_pids: list[int], settings: dict[str, Any], train_s: float) -> dict[str, Any]:
    """Hand-out latency and CPU per step of ``next_step(commit=k-1)`` with ``train_s`` of training between steps."""
    step, _ = next_step()
    for _ in range(settings["warmup"]):
        time.sleep(train_s)
        step, _ = next_step(commit=step)
    latencies, measured_start = [], time.perf_counter()
    cpu_before, ranks_before = cpu_seconds([coordinator_pid]), cpu_seconds(rank_pids)
    for _ in range(settings["steps"]):
        time.sleep(train_s)
        started = time.perf_counter()
        step, _ = next_step(commit=step)
        latencies.append(time.perf_counter() - started)
    span = time.perf_counter() - measured_start
    coordinator_cpu, ranks_cpu = cpu_seconds([coordinator_pid]) - cpu_before, cpu_seconds(rank_pids) - ranks_before
    time.sleep(train_s)  # the idle processes' own rate (metrics, Ray's threads), once the ranks refilled
    idle_before, ranks_idle_before, idle_started = cpu_seconds([coordinator_pid]), cpu_seconds(rank_pids), time.perf_counter()
    time.sleep(settings["idle_s"])
    idle_s = time.perf_counter() - idle_started
    idle_rate = (cpu_seconds([coordinator_pid]) - idle_before) / idle_s
    ranks_idle_rate = (cpu_seconds(rank_pids) - ranks_idle_before) / idle_s
    return {
        "last_step": step, "handout_p50_ms": 1e3 * percentile(latencies, 50), "handout_p99_ms": 1e3 * percentile(latencies, 99),
        "coordinator_cpu_ms_per_step": 1e3 * (coordinator_cpu - idle_rate * span) / settings["steps"],
        "coordinator_idle_cpu_ms_per_s": 1e3 * idle_rate,
        "ranks_cpu_ms_per_step": 1e3 * (ranks_cpu - ranks_idle_rate * span) / settings["steps"],
        "ranks_idle_cpu_ms_per_s": 1e3 * ranks_idle_rate,
        "load_steps": load_average(),
    }  # fmt: skip


def measure_bare_handout(ray: Any, spec: Any, world: int, fingerprint: str, settings: dict[str, Any], train_s: float) -> dict[str, Any]:
    """The bare-Ray contender at ``world`` ranks (:mod:`benchmarks.bare_ray`), same batch and state sizes."""
    from benchmarks.bare_ray import BareCoordinator, BareRank
    from rl_data.distributed.rank_actor import loader_builder
    from rl_data.tasks.synthetic import load_stub_tokenizer

    loader = loader_builder(spec)(spec, load_stub_tokenizer(), logical_rank=0, logical_world_size=world,
                                  placement_fingerprint=fingerprint)  # fmt: skip
    batch = next(iter(loader))
    state = loader.state_dict()
    ranks = [ray.remote(BareRank).options(num_cpus=0).remote(batch, state) for _ in range(world)]
    coordinator = ray.remote(BareCoordinator).options(num_cpus=0).remote(ranks)
    coordinator_pid = ray.get(coordinator.pid.remote(), timeout=TIMEOUT_S)

    def next_step(commit: Any = None) -> tuple[int, list[Any]]:
        return ray.get(coordinator.next_step.remote(commit), timeout=TIMEOUT_S)

    figures = measure_handout(next_step, coordinator_pid, [], settings, train_s)
    for actor in [coordinator, *ranks]:
        ray.kill(actor, no_restart=True)
    return {f"bare_{key}": figures[key] for key in ("coordinator_cpu_ms_per_step", "handout_p50_ms", "load_steps")}


def measure_shards(world: int, settings: dict[str, Any], tmp: Path, log: Any) -> dict[str, Any]:
    """Every coordinator figure at ``world`` logical shards, in a private Ray (see the module doc)."""
    from rl_data.distributed.client import CoordinatorClient, wait_until_name_is_free
    from rl_data.distributed.config import ParallelLayout, RuntimeConfig
    from rl_data.distributed.coordinator import start_data_coordinator
    from rl_data.tasks.synthetic import synthetic_loader_spec

    spec = synthetic_loader_spec(batch_size=settings["batch_size"], samples_per_rank=settings["samples_per_rank"],
                                 tokens_per_sample=settings["tokens"], state_bytes=settings["state_bytes"], name="scale")  # fmt: skip
    config = RuntimeConfig(
        parallel_layout=ParallelLayout(dp=world), prefetch_depth=2, bundle_resources={"CPU": settings["rank_cpu"]},
        rank_actor_num_cpus=settings["rank_cpu"], namespace=NAMESPACE, name=f"scale_{world}",
        step_timeout_s=TIMEOUT_S, control_timeout_s=TIMEOUT_S,
    )  # fmt: skip
    row: dict[str, Any] = {"shards": world, "load_before": load_average()}
    train_s = settings["train_s_per_rank"] * world
    with private_ray(settings["ray_cpus"], tmp) as ray:

        def start() -> tuple[Any, CoordinatorClient, float]:
            started = time.perf_counter()
            handle = start_data_coordinator(config, spec)
            return handle, CoordinatorClient(handle, timeout_s=TIMEOUT_S), time.perf_counter() - started

        def stop(handle: Any) -> None:
            ray.get(handle.shutdown.remote(), timeout=TIMEOUT_S)
            ray.kill(handle, no_restart=True)
            wait_until_name_is_free(config.name, config.namespace, TIMEOUT_S)

        def ids(refs: list[Any]) -> list[list[str]]:
            return [batch["source_ids"] for batch in ray.get(refs, timeout=TIMEOUT_S)]

        handle, client, row["startup_s"] = start()
        status = client.status()
        coordinator_pid, rank_pids = status["pid"], [rank["pid"] for rank in status["ranks"]]
        row["rank_start_cpu_s_median"] = statistics.median(cpu_seconds([pid]) for pid in rank_pids)  # process start to ready
        fingerprint = status["placement_fingerprint"]
        log(f"G={world}: started in {row['startup_s']:.1f} s (load {load_average()})")
        client.save_checkpoint(str(tmp / f"warmup_{world}"))  # waits for the coordinator's background torch import
        row.update(measure_handout(client.next_step, coordinator_pid, rank_pids, settings, train_s))
        step = row.pop("last_step")
        row["coordinator_memory"] = memory_mb(coordinator_pid)
        rank_memory = [memory_mb(pid) for pid in rank_pids]
        row["rank_rss_mb_median"] = statistics.median(m["rss_mb"] for m in rank_memory)
        row["rank_uss_mb_median"] = statistics.median(m["uss_mb"] for m in rank_memory)
        log(f"G={world}: hand-out p50 {row['handout_p50_ms']:.1f} ms, coordinator {row['coordinator_cpu_ms_per_step']:.1f} CPU-ms/step")

        client.commit(step)
        checkpoint_dir = str(tmp / f"ckpt_{world}")
        saves = []
        for _ in range(settings["repeats"]):
            started = time.perf_counter()
            path = client.save_checkpoint(checkpoint_dir)
            saves.append(time.perf_counter() - started)
        saved_step = step
        row.update({"checkpoint_s": statistics.median(saves), "checkpoint_s_all": saves,
                    "checkpoint_mb": Path(path).stat().st_size / 2**20, "load_checkpoint": load_average()})  # fmt: skip

        rewinds, first_steps, exact = [], [], True
        check_steps = [saved_step + 1, saved_step + 2]
        reference = expected_ids(spec, world, fingerprint, check_steps + [saved_step + 3])
        for _ in range(settings["repeats"]):
            client.next_step()  # a step pending, ranks prefetching: what a framework restart meets
            started = time.perf_counter()
            client.load_checkpoint(checkpoint_dir)
            rewinds.append(time.perf_counter() - started)
            started = time.perf_counter()
            first, refs = client.next_step()
            first_steps.append(time.perf_counter() - started)
            exact &= first == saved_step + 1 and ids(refs) == reference[first]
        row.update({"rewind_s": statistics.median(rewinds), "rewind_first_step_s": statistics.median(first_steps),
                    "load_restore": load_average()})  # fmt: skip

        client.commit(saved_step + 1)
        name = client.status()["rank_actor_names"][world // 2]
        ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
        started = time.perf_counter()
        replaced_step, refs = client.next_step()
        row["dead_rank_s"] = time.perf_counter() - started
        exact &= replaced_step == saved_step + 2 and ids(refs) == reference[replaced_step]
        client.commit(replaced_step)
        after, refs = client.next_step()
        exact &= ids(refs) == reference[after]
        row["restarts"] = sum(client.status()["restarts"])
        log(f"G={world}: checkpoint {row['checkpoint_s']:.2f} s {row['checkpoint_mb']:.2f} MB, rewind {row['rewind_s']:.2f} s, "
            f"dead rank {row['dead_rank_s']:.2f} s")  # fmt: skip
        stop(handle)

        handle, client, second_start = start()
        started = time.perf_counter()
        client.load_checkpoint(checkpoint_dir)
        row["fresh_restore_s"] = time.perf_counter() - started
        started = time.perf_counter()
        first, refs = client.next_step()
        row["fresh_first_step_s"] = time.perf_counter() - started
        exact &= first == saved_step + 1 and ids(refs) == reference[first]
        row.update({"startup_s_second": second_start, "exact": exact, "load_after": load_average()})
        stop(handle)
        row.update(measure_bare_handout(ray, spec, world, fingerprint, settings, train_s))
        row["coordinator_cpu_over_bare"] = row["coordinator_cpu_ms_per_step"] / row["bare_coordinator_cpu_ms_per_step"]
        log(f"G={world}: bare Ray {row['bare_coordinator_cpu_ms_per_step']:.1f} CPU-ms/step (rl_data / bare {row['coordinator_cpu_over_bare']:.2f})")
    return row


class CallerHost:
    """One process of feed callers (a Ray actor): ``callers`` asyncio tasks, each ``take`` then ``ack``,
    in a closed loop (``pause_s`` 0) or pausing 0.5-1.5 x ``pause_s`` before every round (a rollout's pace)."""

    async def run(self, feed: Any, callers: int, rounds: int, take_n: int, pause_s: float = 0.0) -> dict[str, list[float]]:
        import random

        takes: list[float] = []
        acks: list[float] = []
        pace = random.Random(0)

        async def caller() -> None:
            for index in range(rounds):
                if pause_s:
                    await asyncio.sleep(pause_s * pace.uniform(0.5, 1.5))
                started = time.perf_counter()
                prompts = await feed.take.remote(take_n)
                taken = time.perf_counter()
                await feed.ack.remote([prompt.uid for prompt in prompts])
                if index:  # the first round of every caller starts all at once: not kept
                    takes.append(taken - started)
                    acks.append(time.perf_counter() - taken)

        started = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(callers)))
        return {"take": takes, "ack": acks, "seconds": [time.perf_counter() - started]}


def start_feed(ray: Any, settings: dict[str, Any], name: str, max_outstanding: int) -> Any:
    from rl_data.distributed.config import ParallelLayout, RuntimeConfig
    from rl_data.prompt_feed.feed import FeedConfig, start_prompt_feed
    from rl_data.tasks.synthetic import synthetic_loader_spec

    spec = synthetic_loader_spec(batch_size=settings["feed_batch"], samples_per_rank=max(settings["outstanding"]),
                                 tokens_per_sample=settings["prompt_tokens"], name="scale-prompts")  # fmt: skip
    config = RuntimeConfig(
        parallel_layout=ParallelLayout(dp=settings["feed_ranks"]), bundle_resources={"CPU": 0.25}, rank_actor_num_cpus=0.25,
        namespace=NAMESPACE, name=name, step_timeout_s=TIMEOUT_S, control_timeout_s=TIMEOUT_S,
    )  # fmt: skip
    return start_prompt_feed(config, spec, FeedConfig(max_outstanding=max_outstanding))


def measure_feed_callers(settings: dict[str, Any], tmp: Path, log: Any) -> list[dict[str, Any]]:
    """Take/ack latency per number of callers, closed loop then paced (``pace_s``); then the bare-Ray
    contender (:class:`benchmarks.bare_ray.BareFeed`) in a closed loop, same callers and hosts."""
    from benchmarks.bare_ray import BareFeed

    closed = [(0.0, callers) for callers in settings["callers"]]
    paced = [(settings["pace_s"], callers) for callers in settings["callers"]]
    with private_ray(settings["ray_cpus"], tmp) as ray:
        window = max(settings["callers"]) * settings["take_n"] + 64
        hosts = [ray.remote(CallerHost).options(num_cpus=0).remote() for _ in range(settings["caller_hosts"])]
        feed = start_feed(ray, settings, "scale_feed_callers", window)
        rows = caller_levels(ray, feed, hosts, closed + paced, settings, "feed", log)
        ray.get(feed.shutdown.remote(), timeout=TIMEOUT_S)
        ray.kill(feed, no_restart=True)
        bare = ray.remote(BareFeed).options(num_cpus=0).remote(settings["prompt_tokens"])
        for row, bare_row in zip(rows, caller_levels(ray, bare, hosts, closed, settings, "bare Ray feed", log)):
            row.update({f"bare_{key}": bare_row[key] for key in ("take_p50_ms", "take_p99_ms", "ack_p50_ms", "calls_per_s", "load_after")})
            row["take_p50_over_bare"] = row["take_p50_ms"] / row["bare_take_p50_ms"]
    return rows


def caller_levels(ray: Any, feed: Any, hosts: list[Any], levels: list[tuple[float, int]], settings: dict[str, Any],
                  what: str, log: Any) -> list[dict[str, Any]]:  # fmt: skip
    """One row per ``(pause_s, callers)`` level: take/ack latency and calls per second of ``feed``."""
    rows = []
    ray.get([host.run.remote(feed, 1, 3, settings["take_n"]) for host in hosts], timeout=TIMEOUT_S)  # warm-up
    for pause_s, callers in levels:
        used = hosts[: min(callers, len(hosts))]
        rounds = settings["paced_rounds"] if pause_s else max(4, settings["takes_per_level"] // callers + 1)
        load_before = load_average()
        started = time.perf_counter()
        results = ray.get([host.run.remote(feed, callers // len(used), rounds, settings["take_n"], pause_s) for host in used],
                          timeout=TIMEOUT_S)  # fmt: skip
        seconds = time.perf_counter() - started
        takes = [t for r in results for t in r["take"]]
        acks = [t for r in results for t in r["ack"]]
        calls = 2 * callers * rounds
        rows.append({
            "callers": callers, "pause_s": pause_s, "hosts": len(used), "rounds": rounds,
            "load_before": load_before, "load_after": load_average(),
            "take_p50_ms": 1e3 * percentile(takes, 50), "take_p99_ms": 1e3 * percentile(takes, 99),
            "ack_p50_ms": 1e3 * percentile(acks, 50), "ack_p99_ms": 1e3 * percentile(acks, 99),
            "calls_per_s": calls / seconds,
        })  # fmt: skip
        log(f"{what}, {callers} callers (pause {pause_s} s): take p50 {rows[-1]['take_p50_ms']:.1f} ms, "
            f"p99 {rows[-1]['take_p99_ms']:.1f} ms, {rows[-1]['calls_per_s']:.0f} calls/s")  # fmt: skip
    return rows


def measure_feed_outstanding(settings: dict[str, Any], tmp: Path, log: Any) -> dict[str, Any]:
    from rl_data.prompt_feed.client import TrainerClient

    levels, result = [], {}
    with private_ray(settings["ray_cpus"], tmp) as ray:
        top = max(settings["outstanding"])
        feed = start_feed(ray, settings, "scale_feed_outstanding", top)
        trainer = TrainerClient(feed, timeout_s=TIMEOUT_S)
        pid = trainer.status()["pid"]
        base = memory_mb(pid)["rss_mb"]
        taken: list[Any] = []
        for level in settings["outstanding"]:
            while len(taken) < level:
                taken += [prompt.uid for prompt in ray.get(feed.take.remote(min(1000, level - len(taken))), timeout=TIMEOUT_S)]
            directory = str(tmp / f"feed_{level}")
            started = time.perf_counter()
            path = trainer.save_checkpoint(directory)
            save_s = time.perf_counter() - started
            round_trips = []
            for _ in range(20):
                started = time.perf_counter()
                one = ray.get(feed.take.remote(1), timeout=TIMEOUT_S)
                trainer.ack([prompt.uid for prompt in one])
                round_trips.append(time.perf_counter() - started)
            levels.append({
                "outstanding": level, "rss_mb": memory_mb(pid)["rss_mb"], "rss_above_start_mb": memory_mb(pid)["rss_mb"] - base,
                "checkpoint_s": save_s, "checkpoint_kb": Path(path).stat().st_size / 1024,
                "take1_ack_p50_ms": 1e3 * percentile(round_trips, 50), "load": load_average(),
            })  # fmt: skip
            log(f"feed, {level} outstanding: RSS +{levels[-1]['rss_above_start_mb']:.0f} MB, checkpoint "
                f"{levels[-1]['checkpoint_kb']:.1f} KB in {save_s:.2f} s")  # fmt: skip
        trainer.ack(taken[1::2])  # out of order: every other uid resolved above the low-water mark
        started = time.perf_counter()
        path = trainer.save_checkpoint(str(tmp / "feed_half_acked"))
        result["half_acked"] = {
            "outstanding": len(taken) - len(taken[1::2]), "resolved_above_low_water_mark": len(taken[1::2]),
            "checkpoint_s": time.perf_counter() - started, "checkpoint_kb": Path(path).stat().st_size / 1024,
            "rss_mb": memory_mb(pid)["rss_mb"],
        }  # fmt: skip
        started = time.perf_counter()
        trainer.load_checkpoint(str(tmp / "feed_half_acked"))  # a rewind of the live feed: ranks in place, ledger rebuilt
        result["half_acked"]["rewind_s"] = time.perf_counter() - started
        ray.get(feed.shutdown.remote(), timeout=TIMEOUT_S)
    result["levels"] = levels
    result["rss_at_start_mb"] = base
    return result


def fits(results: dict[str, Any]) -> dict[str, Any]:
    shards = results["shards"]
    xs = [row["shards"] for row in shards]
    coordinator = {key: linear_fit(xs, [row[key] for row in shards]) for key in (
        "startup_s", "handout_p50_ms", "coordinator_cpu_ms_per_step", "bare_coordinator_cpu_ms_per_step", "ranks_cpu_ms_per_step", "checkpoint_s",
        "checkpoint_mb", "rewind_s", "fresh_restore_s", "dead_rank_s")}  # fmt: skip
    feed = {}
    for mode, paced in (("closed", False), ("paced", True)):
        rows = [row for row in results["feed_callers"] if bool(row["pause_s"]) == paced]
        cx = [row["callers"] for row in rows]
        keys = ("take_p50_ms", "take_p99_ms", "ack_p50_ms") + (() if paced else ("bare_take_p50_ms",))
        feed.update({f"{mode}_{key}": linear_fit(cx, [row[key] for row in rows]) for key in keys})
    levels = results["feed_outstanding"]["levels"]
    ox = [level["outstanding"] for level in levels]
    outstanding = {key: linear_fit(ox, [level[key] for level in levels]) for key in ("rss_above_start_mb", "checkpoint_kb")}
    return {"coordinator": coordinator, "feed_callers": feed, "feed_outstanding": outstanding}


def markdown(results: dict[str, Any]) -> str:
    fit = results["fits"]
    lines = [f"# Scale ({results['date']}, {results['machine']})", "",
             f"Load (1-min) before the run {results['load_start']}, after {results['load_end']}.", "",
             ("| G | start-up s (second) | rank start CPU s | hand-out p50 / p99 ms | coordinator CPU ms/step (bare Ray; ratio) | ranks CPU ms/step | "
              "checkpoint s | checkpoint MB | rewind s (+ first step) | fresh restore s (+ first step) | dead rank s | "
              "coordinator RSS MB | rank USS MB | exact | load |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results["shards"]:
        lines.append(
            f"| {r['shards']} | {r['startup_s']:.1f} / {r['startup_s_second']:.1f} | {r['rank_start_cpu_s_median']:.2f} | "
            f"{r['handout_p50_ms']:.1f} / {r['handout_p99_ms']:.1f} | "
            f"{r['coordinator_cpu_ms_per_step']:.1f} ({r['bare_coordinator_cpu_ms_per_step']:.1f}; {r['coordinator_cpu_over_bare']:.2f}) | {r['ranks_cpu_ms_per_step']:.0f} | {r['checkpoint_s']:.3f} | {r['checkpoint_mb']:.3f} | "
            f"{r['rewind_s']:.2f} (+{r['rewind_first_step_s']:.2f}) | {r['fresh_restore_s']:.2f} (+{r['fresh_first_step_s']:.2f}) | "
            f"{r['dead_rank_s']:.2f} | {r['coordinator_memory']['rss_mb']:.0f} | {r['rank_uss_mb_median']:.1f} | {r['exact']} | "
            f"{r['load_before']} -> {r['load_after']} |"
        )  # fmt: skip
    lines += ["", "| coordinator figure | per rank | fixed | slope ratio (upper / lower half) | line at G = 1,024 |", "|---|---|---|---|---|"]
    for key, f in fit["coordinator"].items():
        lines.append(f"| {key} | {f['per_unit']:.4g} | {f['fixed']:.4g} | {f['slope_ratio']:.2f} | {f['at_1024']:.4g} |")
    lines += ["", "Bare Ray: the same call pattern with rl_data's work taken out (`benchmarks/bare_ray.py`), same run.", "",
              "| callers | pause before a round s | hosts | take p50 / p99 ms | ack p50 / p99 ms | calls/s | bare Ray take p50 ms, calls/s (ratio) | load |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results["feed_callers"]:
        pause = f"{0.5 * r['pause_s']:g}-{1.5 * r['pause_s']:g}" if r["pause_s"] else "0 (closed loop)"
        bare = f"{r['bare_take_p50_ms']:.1f}, {r['bare_calls_per_s']:.0f} ({r['take_p50_over_bare']:.2f})" if "bare_take_p50_ms" in r else ""
        lines.append(f"| {r['callers']} | {pause} | {r['hosts']} | {r['take_p50_ms']:.1f} / {r['take_p99_ms']:.1f} | "
                     f"{r['ack_p50_ms']:.1f} / {r['ack_p99_ms']:.1f} | {r['calls_per_s']:.0f} | {bare} | {r['load_before']} -> {r['load_after']} |")  # fmt: skip
    lines += ["", "| feed figure | per caller | fixed | slope ratio | line at 1,024 callers |", "|---|---|---|---|---|"]
    for key, f in fit["feed_callers"].items():
        lines.append(f"| {key} | {f['per_unit']:.4g} | {f['fixed']:.4g} | {f['slope_ratio']:.2f} | {f['at_1024']:.4g} |")
    outstanding = results["feed_outstanding"]
    lines += ["", f"Feed RSS at start {outstanding['rss_at_start_mb']:.0f} MB.", "",
              "| outstanding | feed RSS MB (above start) | checkpoint KB | save s | take(1)+ack p50 ms | load |", "|---|---|---|---|---|---|"]  # fmt: skip
    for level in outstanding["levels"]:
        lines.append(f"| {level['outstanding']:,} | {level['rss_mb']:.0f} (+{level['rss_above_start_mb']:.0f}) | {level['checkpoint_kb']:.1f} | "
                     f"{level['checkpoint_s']:.3f} | {level['take1_ack_p50_ms']:.1f} | {level['load']} |")  # fmt: skip
    half = outstanding["half_acked"]
    lines.append(f"| {half['outstanding']:,} (+{half['resolved_above_low_water_mark']:,} acked above the low-water mark) | "
                 f"{half['rss_mb']:.0f} | {half['checkpoint_kb']:.1f} | {half['checkpoint_s']:.3f} (rewind to it: {half['rewind_s']:.2f} s) | | |")  # fmt: skip
    for key, f in fit["feed_outstanding"].items():
        lines.append(f"\n{key}: {1e3 * f['per_unit']:.4g} per 1,000 outstanding prompts (slope ratio {f['slope_ratio']:.2f})")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shards = results["shards"]
    g = [r["shards"] for r in shards]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels = [
        (axes[0][0], "per step (ms)", [("coordinator CPU", "coordinator_cpu_ms_per_step"), ("bare Ray coordinator CPU", "bare_coordinator_cpu_ms_per_step"),
                                       ("hand-out p50", "handout_p50_ms")]),
        (axes[0][1], "seconds", [("start-up", "startup_s"), ("rewind", "rewind_s"), ("fresh restore", "fresh_restore_s"),
                                 ("dead rank", "dead_rank_s"), ("checkpoint save", "checkpoint_s")]),
    ]  # fmt: skip
    for axis, label, series in panels:
        for name, key in series:
            axis.plot(g, [r[key] for r in shards], marker="o", label=name)
        axis.set_xlabel("logical shards G")
        axis.set_ylabel(label)
        axis.legend()
    axes[1][0].plot(g, [r["checkpoint_mb"] for r in shards], marker="o")
    axes[1][0].set_xlabel("logical shards G")
    axes[1][0].set_ylabel("checkpoint MB")
    for mode, paced in (("closed loop", False), ("paced", True)):
        rows = [r for r in results["feed_callers"] if bool(r["pause_s"]) == paced]
        for name, key in (("take p50", "take_p50_ms"), ("take p99", "take_p99_ms")):
            axes[1][1].plot([r["callers"] for r in rows], [r[key] for r in rows], marker="o", label=f"{name}, {mode}")
    closed = [r for r in results["feed_callers"] if not r["pause_s"]]
    axes[1][1].plot([r["callers"] for r in closed], [r["bare_take_p50_ms"] for r in closed], marker="x", linestyle="--",
                    label="bare Ray take p50, closed loop")  # fmt: skip
    axes[1][1].set_yscale("log")
    axes[1][1].set_xlabel("concurrent feed callers")
    axes[1][1].set_ylabel("ms")
    axes[1][1].legend()
    fig.suptitle(f"rl_data scale curve ({results['machine']}, load {results['load_start']} -> {results['load_end']})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run(settings: dict[str, Any], out: Path, log: Any) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{os.cpu_count()} cores",
                               "settings": settings, "load_start": load_average()}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="rl_data_scale_") as tmp:
        with private_ray(settings["ray_cpus"], Path(tmp)) if settings["one_ray"] else contextlib.nullcontext():
            results["shards"] = [measure_shards(world, settings, Path(tmp), log) for world in settings["shards"]]
            log(f"coordinator part done (load {load_average()})")
            results["feed_callers"] = measure_feed_callers(settings, Path(tmp), log)
            results["feed_outstanding"] = measure_feed_outstanding(settings, Path(tmp), log)
    results["load_end"] = load_average()
    results["fits"] = fits(results)
    paths = {"json": out / "scale.json", "markdown": out / "scale.md", "plot": out / "scale.png"}
    paths["json"].write_text(json.dumps(results, indent=1, default=str))
    paths["markdown"].write_text(markdown(results))
    plot(results, paths["plot"])
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="G = 1, 2 and 1, 4 callers, one Ray: checks the benchmark runs, timings not meaningful")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--shards", type=int, nargs="+", default=None, help="logical shard counts (default 8 32 128)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    settings = dict(QUICK if args.quick else FULL)
    if args.shards:
        settings["shards"] = tuple(args.shards)
    paths = run(settings, args.out, lambda message: print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
