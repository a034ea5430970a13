"""The consumer loop every contender is measured with, and a peak-memory sampler.

:func:`consume` pulls steps from ``next_step`` (a callable returning one training batch or
one merged step, see :mod:`benchmarks.encoding`):

1. *throughput phase*: as fast as possible until ``samples_target`` samples arrived: time to
   first batch; samples/s and non-pad tokens/s from ``start`` (building the pipeline) to the
   last batch, start-up included, because a pipeline that pre-buffers while the first batch is
   late (Ray Data does) looks arbitrarily fast when timed from its first batch; the rate from
   the first batch is kept as ``steady_*``;
2. checkpoint save (``save``), timed, right after the throughput phase;
3. *wait phase*: ``wait_steps`` steps, each followed by a simulated train step of
   ``step_factor`` x the production time per step measured in phase 1 (so the trainer is
   slower than production and a prefetching pipeline should keep it waiting ~0 ms); the wait
   per step is the time ``next_step`` took. The first two steps are excluded from p50/p99
   (the prefetch queue was drained by phase 1). The ids of the first wait-phase step are what
   a restore of the saved state must deliver first.

``non_pad_share`` is non-pad tokens / elements of the delivered ``input_ids`` (how much of
what the trainer computes on is real data: padding to the longest row, or pack utilisation).

With ``cpu_clock`` the CPU time of this process (``time.process_time()``, all its threads) from
the first batch to the last of the throughput phase is recorded too, and the steady rate per
CPU-second: meaningful only where all the loading runs in this one process (contender a).
"""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import psutil
import torch

from benchmarks.encoding import touch

WARMUP_STEPS = 2


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def consume(
    next_step: Callable[[], Mapping[str, Any]],
    *,
    start: float,
    samples_target: int,
    wait_steps: int,
    step_factor: float,
    save: Callable[[], Any] | None = None,
    cpu_clock: bool = False,
) -> dict[str, Any]:
    """Run both phases (see the module docstring); ``start`` is when building the pipeline began."""
    first = next_step()
    first_at = time.perf_counter()
    first_cpu = time.process_time()
    samples, tokens, steps, area = 0, 0, 0, touch(first)
    while samples + first["num_samples"] < samples_target:
        step = next_step()
        area += touch(step)
        samples += step["num_samples"]
        tokens += step["num_tokens"]
        steps += 1
    end = time.perf_counter()
    steady_cpu_s = time.process_time() - first_cpu
    elapsed = max(end - first_at, 1e-9)
    total_samples, total_tokens = samples + first["num_samples"], tokens + first["num_tokens"]
    production_s = elapsed / max(steps, 1)
    save_s = None
    if save is not None:
        begin = time.perf_counter()
        save()
        save_s = time.perf_counter() - begin
    train_step_s = step_factor * production_s
    waits, expected_ids = [], None
    for index in range(wait_steps):
        begin = time.perf_counter()
        step = next_step()
        waits.append(time.perf_counter() - begin)
        if index == 0:
            expected_ids = list(step["ids"])
        touch(step)
        time.sleep(train_step_s)
    steady = waits[WARMUP_STEPS:] or waits
    cpu = {}
    if cpu_clock:
        cpu = {"steady_cpu_s": steady_cpu_s, "steady_non_pad_tokens_per_cpu_s": tokens / max(steady_cpu_s, 1e-9)}
    return {
        **cpu,
        "time_to_first_batch_s": first_at - start,
        "samples": total_samples,
        "non_pad_tokens": total_tokens,
        "samples_per_s": total_samples / (end - start),
        "non_pad_tokens_per_s": total_tokens / (end - start),
        "steady_samples_per_s": samples / elapsed,
        "steady_non_pad_tokens_per_s": tokens / elapsed,
        "non_pad_share": total_tokens / area if area else None,
        "production_per_step_s": production_s,
        "train_step_s": train_step_s,
        "wait_p50_ms": 1e3 * percentile(steady, 50),
        "wait_p99_ms": 1e3 * percentile(steady, 99),
        "checkpoint_save_s": save_s,
        "batches_before_save": steps + 1,
        "expected_ids_after_restore": expected_ids,
    }


class SavedState:
    """An in-process contender's checkpoint: ``torch.save`` bytes of its loader state."""

    def __init__(self) -> None:
        self.data = b""

    def save(self, state: Any) -> None:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        self.data = buffer.getvalue()

    def load(self, *, weights_only: bool) -> Any:
        return torch.load(io.BytesIO(self.data), weights_only=weights_only)


#: Seconds between memory samples of a Ray session's process tree (see :class:`PeakMemory`).
RAY_TREE_INTERVAL_S = 5.0


class PeakMemory:
    """Peak proportional set size (PSS, shared pages split) of this process tree, in MB, above a baseline.

    PSS rather than RSS so Ray's shared object-store pages and forked workers' shared pages
    are not counted once per process. Use as a context manager; read :attr:`peak_mb`. Reading
    PSS walks every process's page tables: one sample of a Ray session's process tree costs
    ~0.1 CPU-s (measured), so a Ray contender samples every :data:`RAY_TREE_INTERVAL_S` (at
    1 Hz it took ~10 % of a core from the measured contender; a few processes: every second).
    """

    def __init__(self, interval_s: float = 1.0) -> None:
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.baseline_mb = self._sample()
        self.peak_mb = 0.0

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.peak_mb = max(self.peak_mb, self._sample() - self.baseline_mb)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak_mb = max(self.peak_mb, self._sample() - self.baseline_mb)

    @staticmethod
    def _sample() -> float:
        root = psutil.Process(os.getpid())
        total = 0
        for process in [root, *root.children(recursive=True)]:
            try:
                info = process.memory_full_info()
                total += getattr(info, "pss", info.rss)
            except (psutil.Error, OSError):
                continue
        return total / 2**20
