"""Micro-benchmark: a batch from an Energon worker process to the loader's process.

torch's way (``ForkingPickler``: one shared-memory segment and one file-descriptor hand-over per
tensor, what a ``DataLoader`` worker does with a bare item) against rl_data's
(:mod:`rl_data.energon.worker_items`: tensors up to 1 MB inside the message), on real batches of
the workload, unpacked (padded tensors) and packed. A forked process sends the batches through a
``multiprocessing`` queue, as a ``DataLoader`` worker does; the two ways alternate, and each
figure is the median over ``worker_item_rounds``: CPU ms per batch of the sender (all its
threads: pickling happens in the queue's feeder thread) and of the receiving thread.
Run before Ray starts in the benchmark process: the sender is forked from it.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections.abc import Mapping
from typing import Any

import torch

from benchmarks.energon_bare import loader_kwargs
from benchmarks.settings import BenchSettings
from benchmarks.workload import Workload
from rl_data.energon.sft_dataloader import build_energon_sft_loader
from rl_data.energon.worker_checkpoints import WithCheckpoint

WAYS = ("shared_memory", "inline")
SEND_TIMEOUT_S = 120.0


def run(workload: Workload, settings: BenchSettings, tokenizer: Any) -> dict[str, Any]:
    """Per mode: tensors per batch and each way's sender / receiver CPU ms per batch, ratios."""
    results: dict[str, Any] = {}
    for mode in settings.modes:
        batches = _real_batches(workload, settings, tokenizer, packing=mode == "packed")
        samples: dict[str, dict[str, list[float]]] = {way: {"sender": [], "receiver": []} for way in WAYS}
        for _ in range(settings.worker_item_rounds):
            for way in WAYS:
                sender_s, receiver_s = _send(batches, inline=way == "inline")
                samples[way]["sender"].append(1e3 * sender_s / len(batches))
                samples[way]["receiver"].append(1e3 * receiver_s / len(batches))
        figures: dict[str, Any] = {"batches": len(batches), "tensors_per_batch": _count_tensors(batches[0])}
        for way in WAYS:
            for side in ("sender", "receiver"):
                figures[f"{way}_{side}_ms"] = statistics.median(samples[way][side])
        for side in ("sender", "receiver"):
            figures[f"{side}_shared_memory_vs_inline"] = figures[f"shared_memory_{side}_ms"] / max(figures[f"inline_{side}_ms"], 1e-9)
        results[mode] = figures
    return results


def _real_batches(workload: Workload, settings: BenchSettings, tokenizer: Any, *, packing: bool) -> list[Any]:
    loader = build_energon_sft_loader(processor=tokenizer, **loader_kwargs(workload, settings, packing=packing))
    try:
        batches = iter(loader)
        return [next(batches) for _ in range(settings.worker_item_batches)]
    finally:
        loader.close()


def _count_tensors(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return 1
    if isinstance(value, Mapping):
        return sum(_count_tensors(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_count_tensors(v) for v in value)
    return _count_tensors(value.tensors) if hasattr(value, "tensors") else 0


def _send(batches: list[Any], *, inline: bool) -> tuple[float, float]:
    """CPU seconds of the sender process and of the receiving thread for all ``batches``."""
    context = multiprocessing.get_context("fork")
    queue, done = context.Queue(), context.Event()
    cpu_reader, cpu_writer = context.Pipe(duplex=False)
    sender = context.Process(target=_sender, args=(batches, inline, queue, done, cpu_writer), daemon=True)
    sender.start()
    try:
        begin = time.thread_time()
        for _ in batches:
            item = queue.get(timeout=SEND_TIMEOUT_S)
            if inline and not isinstance(item, WithCheckpoint):
                raise TypeError(f"expected a WithCheckpoint from the sender, got {type(item).__name__}")
        receiver_s = time.thread_time() - begin
        done.set()
        if not cpu_reader.poll(SEND_TIMEOUT_S):
            raise TimeoutError(f"the sender did not report its CPU time within {SEND_TIMEOUT_S:.0f} s")
        return cpu_reader.recv(), receiver_s
    finally:
        sender.join(timeout=SEND_TIMEOUT_S)
        if sender.is_alive():
            sender.kill()


def _sender(batches: list[Any], inline: bool, queue: Any, done: Any, cpu_writer: Any) -> None:
    begin = time.process_time()
    for batch in batches:
        queue.put(WithCheckpoint(batch, None) if inline else batch)
    done.wait(SEND_TIMEOUT_S)  # the receiver has fetched every tensor (shared memory: from this process)
    cpu_writer.send(time.process_time() - begin)
