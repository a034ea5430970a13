"""``python -m benchmarks.soak [--minutes 30] [--out DIR]``: does any long-lived process of rl_data grow?

A memory soak, not a timed benchmark. One driver serves three long-lived services round-robin for
``--minutes`` over small datasets, so that their loaders run through many epochs:

* **coordinator A**: ``start_data_coordinator`` over an Energon SFT loader, 2 ranks, 0 Energon
  workers, unpacked (2 conversations of <= 256 tokens per batch: ~5 KB, below Ray's 100 KB inline
  limit, so its batches sit in the coordinator's in-process store until commit);
* **coordinator B**: the same dataset, 2 ranks with 2 Energon worker processes each, packed
  (first fit decreasing; 2 packs of 8,192 token slots, samples padded to multiples of 1,024: ~200 KB
  per batch, so its batches go through the shared object store);
* **prompt feed**: ``start_prompt_feed`` over a one-shard set of 64 GSM8K-like prompts, 2 ranks,
  taken and acked a few at a time (many epochs of the prompt set).

One loop step serves each once: a training step of A and of B (``next_step``, fetch the batches,
``commit``) and a ``take(k)`` + ``ack`` of the feed. Faults on a schedule of loop steps:

* ``--kill-every N``: ``ray.kill`` of rank 1 of A, of B and of the feed in turn (its owner replaces
  it). Rank 0 is never killed: its process is the one measured over the whole run;
* ``--checkpoint-every N``: ``save_checkpoint`` of A, B and the feed (one folder each, overwritten);
* ``--rewind-every N``: ``load_checkpoint`` of the last checkpoint into the live A and feed (a
  rewind). B is never rewound: a rewind rebuilds the loader, which restarts its Energon worker
  processes, and B's rank-0 workers must live through the whole run for their growth to be measured.

Every ``--sample-every-s`` seconds (the first after the first step): the memory of the coordinators,
the feed, rank 0 of each, B's rank-0 Energon workers (summed) and the driver, twice:

* USS (unique set size: pages no other process maps). It moves when *other* processes come or go:
  a page of a library that only B's two ranks touched becomes unique to rank 0 while rank 1 is dead
  (+2-6 MB on rank 0 of B at each kill of B's rank 1, back down once the replacement touches it);
  and rank 0 of B forks its Energon workers, so its USS starts low (its pages are shared with them)
  and grows as copy-on-write unshares them;
* anonymous resident memory (``rss - shared``: the heap and stacks, no file or shared-memory
  pages): not moved by other processes, the figure to read a leak from; a copy-on-write copy in a
  worker does not show in it.

Also the objects in each owner's in-process Ray store (``status()["objects_in_memory"]``) and the
shared object store's usage. Each series gets a Theil-Sen slope over the second half of the run
(by steps, after warm-up), in MB (or objects) per 1,000 loop steps; ``|slope| <= 0.05`` reads as
flat. Kills and rewinds are listed by step (``faults["events"]``) to tell a jump from steady growth.

Writes ``soak.json`` (settings, fault counts, every sample), ``soak.md`` (the table) and
``soak.png`` to ``--out`` (default ``benchmarks/results/soak``). Starts a private local Ray unless
``--address`` names a cluster or Ray is already initialised (then it uses that one and leaves it up).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "soak"
NAMESPACE = "rl_data_soak"
NAMES = {"a": "soak_coordinator_a", "b": "soak_coordinator_b", "feed": "soak_prompt_feed"}
#: A slope (MB or objects per 1,000 loop steps) at most this large reads as flat.
FLAT_PER_1000_STEPS = 0.05
#: The processes measured: the owners, rank 0 of each, B's rank-0 Energon workers (summed), the driver.
PROCESSES = ("coordinator_a", "coordinator_b", "feed", "rank0_a", "rank0_b", "rank0_b_workers", "rank0_feed", "driver")
#: The owners' in-process Ray stores.
STORES = ("store_a", "store_b", "store_feed")
#: Every series of the table, in its order: (name, unit, the :class:`Sample` field, the key in it).
SERIES = (
    *((name, "USS MB", "uss_mb", name) for name in PROCESSES),
    *((name, "anon MB", "anon_mb", name) for name in PROCESSES),
    *((name, "objects", "objects", name) for name in STORES),
    ("plasma", "MB", "plasma", "mb"),
    ("plasma", "objects", "plasma", "objects"),
)
SFT_CONVERSATIONS = 192
SFT_SAMPLES_PER_SHARD = 12
PROMPTS = 64
#: The services whose rank 1 the kills hit, in turn.
KILL_TARGETS = ("a", "b", "feed")


@dataclass(frozen=True)
class SoakSettings:
    """How long, how often each fault, how often a sample; a fault every 0 steps never happens."""

    minutes: float = 30.0
    kill_every: int = 500
    checkpoint_every: int = 100
    rewind_every: int = 250
    sample_every_s: float = 10.0
    feed_take: int = 4
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        problems = [f"{name}={value!r} must be >= 0" for name, value in
                    (("kill_every", self.kill_every), ("checkpoint_every", self.checkpoint_every),
                     ("rewind_every", self.rewind_every)) if value < 0]  # fmt: skip
        problems += [f"{name}={value!r} must be > 0" for name, value in
                     (("minutes", self.minutes), ("sample_every_s", self.sample_every_s), ("feed_take", self.feed_take),
                      ("timeout_s", self.timeout_s)) if value <= 0]  # fmt: skip
        if problems:
            raise ValueError("SoakSettings: " + "; ".join(problems))


@dataclass
class Sample:
    """One reading after ``steps`` loop steps: per process of :data:`PROCESSES` its USS and anonymous
    resident memory in MB, the objects of each owner's store (:data:`STORES`), the shared object store's
    ``mb`` and ``objects`` (None: not readable), and the pids of B's rank-0 Energon workers."""

    elapsed_s: float
    steps: int
    uss_mb: dict[str, Optional[float]]
    anon_mb: dict[str, Optional[float]]
    objects: dict[str, Optional[int]]
    plasma: dict[str, float]
    b_rank0_worker_pids: list[int]


@dataclass
class Faults:
    """What the loop did to the services (counted as done, not as scheduled)."""

    kills: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KILL_TARGETS, 0))
    #: kills skipped because the previous victim had not been replaced yet
    kills_skipped: int = 0
    checkpoints: int = 0
    rewinds: int = 0
    #: (loop step, what) of every kill and rewind, to tell a jump in a series from steady growth
    events: list[tuple[int, str]] = field(default_factory=list)


# ---- the slope (pure) ----


def second_half_slope(steps: Sequence[float], values: Sequence[Optional[float]]) -> Optional[float]:
    """Theil-Sen slope of ``values`` against ``steps`` over the second half of the run, per 1,000 steps.

    The median of the slopes between every two samples: steady growth gives its rate, while a
    bounded series that happens to sit high in the last few samples (the object store between a
    kill and its replacement's first batches) does not read as growth, as it does in a
    least-squares fit over a short run. The second half: the samples at or after the midpoint
    between the first and the last sample's steps (warm-up growth before it does not count).
    Samples whose value is None are left out. None when fewer than two distinct steps with a value remain.
    """
    if len(steps) != len(values):
        raise ValueError(f"steps and values differ in length: {len(steps)} steps, {len(values)} values")
    if not steps:
        return None
    middle = (steps[0] + steps[-1]) / 2
    points = [(s, v) for s, v in zip(steps, values) if s >= middle and v is not None]
    slopes = [(v2 - v1) / (s2 - s1) for (s1, v1), (s2, v2) in itertools.combinations(points, 2) if s2 != s1]
    return 1000.0 * statistics.median(slopes) if slopes else None


def series_rows(samples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per series of :data:`SERIES` over ``samples`` (:class:`Sample` as dicts): first and last value,
    second-half slope per 1,000 steps, flat or not."""
    steps = [sample["steps"] for sample in samples]
    rows = []
    for name, unit, attribute, key in SERIES:
        values = [sample[attribute][key] for sample in samples]
        known = [v for v in values if v is not None]
        slope = second_half_slope(steps, values)
        rows.append({
            "series": name, "unit": unit, "start": known[0] if known else None, "end": known[-1] if known else None,
            "slope_per_1000_steps": slope, "flat": None if slope is None else abs(slope) <= FLAT_PER_1000_STEPS,
        })  # fmt: skip
    return rows


# ---- the data ----


def write_sft_dataset(root: Path) -> str:
    """:data:`SFT_CONVERSATIONS` chitchat conversations (first 4 turns) as an Energon dataset, split train,
    shards of :data:`SFT_SAMPLES_PER_SHARD` (as large as the train split of the tests' ``energon_dataset``)."""
    from rl_data.energon.dataset_writer import write_energon_dataset
    from rl_data.energon.sample_format import encode_sample
    from rl_data.sample_data import chitchat_conversations

    samples = [
        (f"chat-{row:05d}", encode_sample({"kind": "sft", "messages": list(c["messages"][:4]),
                                           "source": {"file": "chitchat", "row": row}}))
        for row, c in enumerate(chitchat_conversations(SFT_CONVERSATIONS))
    ]  # fmt: skip
    write_energon_dataset(root, samples, samples_per_shard=SFT_SAMPLES_PER_SHARD, splits={"train": 1.0})
    return str(root)


def write_prompt_shard(root: Path) -> str:
    """:data:`PROMPTS` generated word problems (``rl_prompt`` samples) as an Energon dataset of one shard."""
    from benchmarks.prompt_sources import prompt_samples
    from rl_data.energon.dataset_writer import write_energon_dataset
    from rl_data.energon.sample_format import encode_sample

    encoded = [(key, encode_sample(sample)) for key, sample in prompt_samples(PROMPTS)]
    write_energon_dataset(root, encoded, samples_per_shard=len(encoded), splits={"train": 1.0})
    return str(root)


# ---- the services ----


def runtime_config(name: str) -> Any:
    """2 ranks in bundles of 0.25 CPU; rank deaths replaced without limit (the soak kills ranks on purpose)."""
    from rl_data.distributed.config import ParallelLayout, RuntimeConfig

    return RuntimeConfig(
        parallel_layout=ParallelLayout(dp=2), logical_world_size=2, prefetch_depth=2, bundle_resources={"CPU": 0.25},
        rank_actor_num_cpus=0.25, namespace=NAMESPACE, name=name, max_rank_restarts=10**6,
    )  # fmt: skip


def unpacked_spec(dataset: str) -> Any:
    """Coordinator A's loader: 0 Energon workers, 2 conversations of <= 256 tokens per batch, virtual epochs of 5."""
    from rl_data.distributed.config import LoaderSpec

    energon = {"shuffle_buffer_size": 20, "max_samples_per_sequence": 10, "num_workers": 0}
    return LoaderSpec(data_config={"energon": energon, "shuffle": True},
                      source={"path": dataset, "split": "train", "virtual_epoch_length": 5},
                      batch_size=2, max_sequence_length=256)  # fmt: skip


def packed_spec(dataset: str) -> Any:
    """Coordinator B's loader: 2 Energon workers, 2 packs of 8,192 token slots per batch (~200 KB)."""
    from rl_data.distributed.config import LoaderSpec

    energon = {"shuffle_buffer_size": 20, "max_samples_per_sequence": 10, "packing_buffer_size": 8, "num_workers": 2}
    return LoaderSpec(data_config={"energon": energon, "shuffle": True},
                      source={"path": dataset, "split": "train", "virtual_epoch_length": 5},
                      batch_size=2, max_sequence_length=8192, packing_algorithm="first_fit_decreasing",
                      sequence_length_pad_multiple=1024)  # fmt: skip


def prompt_spec(dataset: str) -> Any:
    """The feed's loader: the ``rl_prompt`` task as ``benchmarks.prompt_feed`` reads it, 8 prompts per batch."""
    from benchmarks.prompt_sources import MAX_LENGTH, SYSTEM_PROMPT
    from rl_data.distributed.config import LoaderSpec

    return LoaderSpec(
        data_config={"energon": {"task": "rl_prompt", "shuffle_buffer_size": 16, "max_samples_per_sequence": 16},
                     "shuffle": True, "system_prompt": SYSTEM_PROMPT, "task": {"generation_padding": "none"}},
        source={"path": dataset, "split": "train"}, batch_size=8, max_sequence_length=MAX_LENGTH,
    )  # fmt: skip


@contextlib.contextmanager
def running_services(sft_dataset: str, prompt_dataset: str, timeout_s: float) -> Iterator[dict[str, Any]]:
    """Coordinators A and B and the prompt feed (handles by ``a``, ``b``, ``feed``), shut down and killed afterwards."""
    from rl_data.distributed.coordinator import start_data_coordinator
    from rl_data.prompt_feed.feed import FeedConfig, start_prompt_feed

    handles: dict[str, Any] = {}
    try:
        handles["a"] = start_data_coordinator(runtime_config(NAMES["a"]), unpacked_spec(sft_dataset))
        handles["b"] = start_data_coordinator(runtime_config(NAMES["b"]), packed_spec(sft_dataset))
        handles["feed"] = start_prompt_feed(runtime_config(NAMES["feed"]), prompt_spec(prompt_dataset),
                                            FeedConfig(max_outstanding=PROMPTS))  # fmt: skip
        yield handles
    finally:
        for key, handle in handles.items():
            shut_down(handle, NAMES[key], timeout_s)


def shut_down(handle: Any, name: str, timeout_s: float) -> None:
    """``shutdown`` (rank actors, placement group), then kill the owner and wait until its name is free."""
    import ray

    from rl_data.distributed.client import wait_until_name_is_free

    with contextlib.suppress(Exception):  # a dead owner cannot shut down; its ranks die with the driver's job
        ray.get(handle.shutdown.remote(), timeout=timeout_s)
    ray.kill(handle, no_restart=True)
    wait_until_name_is_free(name, NAMESPACE, timeout_s)


# ---- one loop step ----


def samples_in(batch: Any) -> int:
    """Samples of one rank's batch (packed batches list the ids of every pack)."""
    ids = batch["source_ids"]
    return sum(len(pack) for pack in ids) if ids and isinstance(ids[0], (list, tuple)) else len(ids)


def train_step(coordinator: Any, timeout_s: float) -> int:
    """What a trainer does once per step: next step, fetch its batches, commit; return the samples read."""
    import ray

    step, refs = ray.get(coordinator.next_step.remote(), timeout=timeout_s)
    batches = ray.get(refs, timeout=timeout_s)
    ray.get(coordinator.commit.remote(step), timeout=timeout_s)
    return sum(samples_in(batch) for batch in batches)


def feed_round(feed: Any, take: int, timeout_s: float) -> tuple[int, int]:
    """Take ``take`` prompts and ack them; return how many it handed out and the epoch of the last one."""
    import ray

    prompts = ray.get(feed.take.remote(take), timeout=timeout_s)
    if not prompts:
        raise RuntimeError(f"the feed handed out no prompts for take({take}); expected {take} (nothing is outstanding)")
    ray.get(feed.ack.remote([p.uid for p in prompts]), timeout=timeout_s)
    return len(prompts), int(prompts[-1].uid[0])


# ---- faults ----


def kill_rank_one(handle: Any, timeout_s: float) -> bool:
    """``ray.kill`` rank 1 of a coordinator or feed; False when its actor is gone already (not replaced yet)."""
    import ray

    name = ray.get(handle.status.remote(), timeout=timeout_s)["rank_actor_names"][1]
    try:
        actor = ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    ray.kill(actor, no_restart=True)
    return True


def apply_faults(step: int, settings: SoakSettings, handles: dict[str, Any], checkpoints: Path, faults: Faults,
                 seconds: dict[str, float], log: Callable[[str], None]) -> None:  # fmt: skip
    """The faults due after loop step ``step``: a kill, checkpoints, a rewind (in that order), counted in
    ``faults``, timed in ``seconds`` (``kill``, ``checkpoint``, ``rewind``: the calls, not the recovery that
    follows a kill in the next steps)."""
    import ray

    timeout = settings.timeout_s
    if settings.kill_every and step % settings.kill_every == 0:
        target = KILL_TARGETS[(step // settings.kill_every - 1) % len(KILL_TARGETS)]
        with timed(seconds, "kill"):
            killed = kill_rank_one(handles[target], timeout)
        if killed:
            faults.kills[target] += 1
            faults.events.append((step, f"kill rank 1 of {target}"))
        else:
            faults.kills_skipped += 1
            log(f"step {step}: rank 1 of {target} is not replaced yet since the last kill; kill skipped")
    if settings.checkpoint_every and step % settings.checkpoint_every == 0:
        with timed(seconds, "checkpoint"):
            ray.get([handles[key].save_checkpoint.remote(str(checkpoints / key)) for key in handles], timeout=timeout)
        faults.checkpoints += 1
    if settings.rewind_every and step % settings.rewind_every == 0 and faults.checkpoints:
        with timed(seconds, "rewind"):
            ray.get([handles[key].load_checkpoint.remote(str(checkpoints / key)) for key in ("a", "feed")], timeout=timeout)
        faults.rewinds += 1
        faults.events.append((step, "rewind a and feed"))


@contextlib.contextmanager
def timed(seconds: dict[str, float], phase: str) -> Iterator[None]:
    """Add the time the block takes to ``seconds[phase]``."""
    started = time.perf_counter()
    try:
        yield
    finally:
        seconds[phase] += time.perf_counter() - started


# ---- sampling ----


def memory_mb(pids: Sequence[int]) -> tuple[Optional[float], Optional[float]]:
    """USS and anonymous resident memory (``rss - shared``: heap and stacks, no file or shared-memory pages) of
    ``pids`` summed, in MB; None for both when none of them runs (any more)."""
    import psutil

    uss = anon = 0
    found = False
    for pid in pids:
        try:
            info = psutil.Process(pid).memory_full_info()
        except psutil.NoSuchProcess:
            continue
        uss, anon, found = uss + info.uss, anon + info.rss - info.shared, True
    return (uss / 2**20, anon / 2**20) if found else (None, None)


def child_pids(pid: Optional[int]) -> list[int]:
    """The child processes of ``pid``, recursively (a rank actor's: its Energon workers); none for a None pid."""
    import psutil

    if pid is None:
        return []
    try:
        return sorted(child.pid for child in psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return []


def plasma_usage(timeout_s: float) -> tuple[float, int]:
    """The shared object store's usage over the cluster: MB used and objects.

    Ray has no public accessor: this is what ``ray memory --stats-only`` and Ray Data read
    (``ray._private.internal_api.get_memory_info_reply``), through the driver's own GCS state.
    """
    import ray
    from ray._private.internal_api import get_memory_info_reply

    stats = get_memory_info_reply(ray._private.state.state, timeout_seconds=timeout_s).store_stats
    return stats.object_store_bytes_used / 2**20, int(stats.num_local_objects)


def take_sample(handles: dict[str, Any], elapsed_s: float, steps: int, timeout_s: float) -> Sample:
    """Read every series once (see the module doc)."""
    import ray

    status = dict(zip(handles, ray.get([h.status.remote() for h in handles.values()], timeout=timeout_s)))
    rank0 = {key: status[key]["ranks"][0].get("pid") for key in handles}  # None: rank 0 did not answer
    workers = child_pids(rank0["b"])
    pids = {
        "coordinator_a": [status["a"]["pid"]], "coordinator_b": [status["b"]["pid"]], "feed": [status["feed"]["pid"]],
        **{f"rank0_{key}": [] if pid is None else [pid] for key, pid in rank0.items()},
        "rank0_b_workers": workers, "driver": [os.getpid()],
    }  # fmt: skip
    memory = {name: memory_mb(pids[name]) for name in PROCESSES}
    plasma_mb, plasma_objects = plasma_usage(timeout_s)
    return Sample(
        elapsed_s=round(elapsed_s, 1), steps=steps,
        uss_mb={name: uss for name, (uss, _) in memory.items()}, anon_mb={name: anon for name, (_, anon) in memory.items()},
        objects={f"store_{key}": status[key].get("objects_in_memory") for key in handles},
        plasma={"mb": plasma_mb, "objects": plasma_objects}, b_rank0_worker_pids=workers,
    )  # fmt: skip


def progress_line(sample: Sample) -> str:
    """One line per sample: the headline figures (USS), so a long run shows it is alive."""

    def mb(name: str) -> str:
        value = sample.uss_mb[name]
        return "-" if value is None else f"{value:.1f}"

    return (f"{sample.elapsed_s:7.0f} s {sample.steps:7d} steps | USS MB: coord A {mb('coordinator_a')} "
            f"B {mb('coordinator_b')} feed {mb('feed')} | rank0 A {mb('rank0_a')} B {mb('rank0_b')} "
            f"feed {mb('rank0_feed')} | B workers {len(sample.b_rank0_worker_pids)} {mb('rank0_b_workers')} | "
            f"driver {mb('driver')} | plasma {sample.plasma['mb']:.1f} MB {sample.plasma['objects']} obj | stores "
            f"A {sample.objects['store_a']} B {sample.objects['store_b']} feed {sample.objects['store_feed']}")  # fmt: skip


# ---- the run ----


@contextlib.contextmanager
def ray_for_soak(address: Optional[str], work: Path) -> Iterator[None]:
    """The Ray already initialised (left up), or a connection to ``address`` / a private local Ray (shut down after)."""
    import ray

    if ray.is_initialized():
        yield
        return
    private = {} if address else {"_temp_dir": str(work / "ray")}
    ray.init(address=address or "local", include_dashboard=False, log_to_driver=False, configure_logging=False,
             namespace=NAMESPACE, **private)  # fmt: skip
    try:
        yield
    finally:
        ray.shutdown()


def soak_loop(handles: dict[str, Any], settings: SoakSettings, checkpoints: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Serve the services round-robin until the time is up, faults on schedule, a sample every ``sample_every_s``:
    the first after the first step (B's Energon workers run from then on), the last when the time is up; a sample
    that falls due while a step takes long (a rank being replaced) is taken once, late. A failure (a timeout, a
    dead owner) ends the loop early: it is returned as ``error``, with everything measured before it."""
    faults, samples, error = Faults(), [], None
    consumed = {"a_samples": 0, "b_samples": 0, "feed_prompts": 0, "feed_epoch": 0}
    seconds = dict.fromkeys(("a", "b", "feed", "kill", "checkpoint", "rewind", "samples"), 0.0)
    started = time.monotonic()
    deadline, next_sample, steps = started + 60 * settings.minutes, started, 0
    while True:
        try:
            with timed(seconds, "a"):
                consumed["a_samples"] += train_step(handles["a"], settings.timeout_s)
            with timed(seconds, "b"):
                consumed["b_samples"] += train_step(handles["b"], settings.timeout_s)
            with timed(seconds, "feed"):
                prompts, consumed["feed_epoch"] = feed_round(handles["feed"], settings.feed_take, settings.timeout_s)
            consumed["feed_prompts"] += prompts
            steps += 1
            apply_faults(steps, settings, handles, checkpoints, faults, seconds, log)
            now = time.monotonic()
            if now >= next_sample or now >= deadline:
                with timed(seconds, "samples"):
                    samples.append(take_sample(handles, now - started, steps, settings.timeout_s))
                log(progress_line(samples[-1]))
                while next_sample <= now:
                    next_sample += settings.sample_every_s
        except Exception as failure:  # noqa: BLE001 - reported with the samples taken so far
            error = f"{type(failure).__name__} at loop step {steps + 1}: {failure}"
            log(f"the soak stopped: {error}")
            break
        if now >= deadline:
            break
    loop_s = time.monotonic() - started
    return {"steps": steps, "loop_s": round(loop_s, 1), "steps_per_min": round(60 * steps / loop_s, 1),
            "seconds_in": {phase: round(s, 1) for phase, s in seconds.items()}, "faults": asdict(faults),
            "consumed": consumed, "error": error, "samples": samples}  # fmt: skip


def owner_counts(handles: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """What each owner counted itself: rank restarts per rank and (coordinators) rewinds, to check the faults landed."""
    import ray

    status = dict(zip(handles, ray.get([h.status.remote() for h in handles.values()], timeout=timeout_s)))
    return {key: {"restarts": s["restarts"], "rewinds": s.get("rewinds")} for key, s in status.items()}


def run_soak(settings: SoakSettings = SoakSettings(), *, out: Path = DEFAULT_OUT, address: Optional[str] = None,
             sft_dataset: Optional[str] = None, log: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    """Run the soak (see the module doc), write ``soak.json``, ``soak.md``, ``soak.png`` to ``out``; return the results.
    A soak that stopped early writes what it measured, then raises ``RuntimeError`` naming the failure.

    ``sft_dataset``: an Energon SFT dataset with a train split to read (default: one written here);
    ``address``: a Ray cluster to connect to (default: a private local Ray, or the one already initialised).
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory(prefix="rl_soak_") as tmp:
        work = Path(tmp)
        sft = sft_dataset or write_sft_dataset(work / "sft")
        prompts = write_prompt_shard(work / "prompts")
        with ray_for_soak(address, work):
            log(f"starting coordinators A, B and the feed (namespace {NAMESPACE})")
            with running_services(sft, prompts, settings.timeout_s) as handles:
                log(f"soaking for {settings.minutes:g} min: {asdict(settings)}")
                loop = soak_loop(handles, settings, work / "checkpoints", log)
                loop["owner_counts"] = None if loop["error"] else owner_counts(handles, settings.timeout_s)
    samples = [asdict(sample) for sample in loop.pop("samples")]
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{os.cpu_count()} cores",
               "settings": asdict(settings), **loop, "rows": series_rows(samples), "samples": samples}  # fmt: skip
    write_reports(results, out)
    if results["error"]:
        raise RuntimeError(f"the soak stopped after {results['steps']} of its steps ({results['error']}); "
                           f"what it measured until then is in {out}")  # fmt: skip
    return results


# ---- reports ----


def markdown(results: dict[str, Any]) -> str:
    """The table of every series, with the run's settings, pace and fault counts above it."""

    def figure(value: Any, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    faults, read = results["faults"], results["consumed"]
    lines = [
        "# Memory soak", "",
        f"{results['date']}, {results['machine']}; {results['settings']['minutes']:g} min, {results['steps']} loop steps "
        f"({results['steps_per_min']:.0f} per minute; seconds in {results['seconds_in']}).", "",
        f"Faults: kills {faults['kills']} (skipped {faults['kills_skipped']}), checkpoints {faults['checkpoints']}, "
        f"rewinds {faults['rewinds']}; settings {results['settings']}. Read: A {read['a_samples']} samples, "
        f"B {read['b_samples']}, the feed {read['feed_prompts']} prompts (last epoch {read['feed_epoch']}).", "",
        *([f"**Stopped early**: {results['error']}", ""] if results["error"] else []),
        f"Slope: Theil-Sen (the median of the slopes between every two samples) over the second half of the run (by steps), per 1,000 loop steps; flat: "
        f"|slope| <= {FLAT_PER_1000_STEPS}.", "",
        "| series | unit | start | end | slope per 1,000 steps | flat |", "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for row in results["rows"]:
        digits = 0 if row["unit"] == "objects" else 1
        lines.append(f"| {row['series']} | {row['unit']} | {figure(row['start'], digits)} | {figure(row['end'], digits)} | "
                     f"{figure(row['slope_per_1000_steps'], 3)} | {'-' if row['flat'] is None else row['flat']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    """Against loop steps: USS; the change of USS (solid) and anonymous memory (dashed) over the second half;
    the objects in the stores; the shared object store's MB. The second half shaded, the kills dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = results["samples"]
    steps = [s["steps"] for s in samples]
    middle = (steps[0] + steps[-1]) / 2
    second = [i for i, step in enumerate(steps) if step >= middle]
    fig, axes = plt.subplots(4, 1, figsize=(11, 15), sharex=True)
    for color, name in enumerate(PROCESSES):
        axes[0].plot(steps, [s["uss_mb"][name] for s in samples], color=f"C{color}", label=name)
        for attribute, style in (("uss_mb", "-"), ("anon_mb", "--")):
            values = [samples[i][attribute][name] for i in second]
            known = [(steps[i], v) for i, v in zip(second, values) if v is not None]
            if known:
                axes[1].plot([x for x, _ in known], [v - known[0][1] for _, v in known], style, color=f"C{color}",
                             label=f"{name} {attribute[:-3]}")  # fmt: skip
    for name in STORES:
        axes[2].plot(steps, [s["objects"][name] for s in samples], label=name)
    axes[2].plot(steps, [s["plasma"]["objects"] for s in samples], label="plasma objects")
    axes[3].plot(steps, [s["plasma"]["mb"] for s in samples], label="plasma MB")
    kills = [step for step, what in results["faults"]["events"] if what.startswith("kill")]
    labels = ("USS MB", "MB change over the second half (USS solid, anon dashed)", "objects", "object store MB")
    for axis, label in zip(axes, labels):
        axis.axvspan(middle, steps[-1], color="grey", alpha=0.15, label="second half (slope fit)")
        for step in kills:
            axis.axvline(step, color="red", linestyle=":", linewidth=0.8)
        axis.set_ylabel(label)
        axis.legend(fontsize=7, ncol=3)
    axes[-1].set_xlabel("loop steps (red dotted: a rank killed)")
    fig.suptitle(f"rl_data memory soak ({results['machine']}, {results['settings']['minutes']:g} min, {results['steps']} steps)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_reports(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "soak.md").write_text(markdown(results))
    if results["samples"]:
        plot(results, out / "soak.png")


def main(argv: list[str] | None = None) -> int:
    defaults = SoakSettings()
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=defaults.minutes, help="how long the loop runs")
    parser.add_argument("--kill-every", type=int, default=defaults.kill_every,
                        help="loop steps between two rank-1 kills (A, B, feed in turn; 0: never)")
    parser.add_argument("--checkpoint-every", type=int, default=defaults.checkpoint_every,
                        help="loop steps between two checkpoints of A, B and the feed (0: never)")
    parser.add_argument("--rewind-every", type=int, default=defaults.rewind_every,
                        help="loop steps between two rewinds of A and the feed to their last checkpoint (0: never)")
    parser.add_argument("--sample-every-s", type=float, default=defaults.sample_every_s, help="seconds between two samples")
    parser.add_argument("--timeout-s", type=float, default=defaults.timeout_s, help="the longest any Ray call may take")
    parser.add_argument("--address", default=None, help="a Ray cluster to connect to (default: a private local Ray)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    settings = SoakSettings(minutes=args.minutes, kill_every=args.kill_every, checkpoint_every=args.checkpoint_every,
                            rewind_every=args.rewind_every, sample_every_s=args.sample_every_s, timeout_s=args.timeout_s)  # fmt: skip
    sys.path.insert(0, str(REPO_ROOT))
    run_soak(settings, out=args.out, address=args.address,
             log=lambda message: print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True))  # fmt: skip
    print((args.out / "soak.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
