"""Micro-benchmarks: a rank's state after every batch, with Energon workers and deferred.

Each worker sends a checkpoint with each batch it makes, so between two states of the rank only
one worker's checkpoint is new. The state is encoded (``rl_data.energon.state_codec``) after every
batch: every checkpoint encoded again (``encode_rank_state(state)``) against only the new one
(``encode_rank_state(state, cache)``, the others' JSON reused: what ``state_dict`` does), on a real
loader of the workload with ``state_worker_counts`` workers, after each of ``state_batches``
batches; the two alternate which runs first, the bytes must be equal, and each figure is the
median ms. Run before Ray starts in the benchmark process: the loader forks its workers.

:func:`deferred`: packed, 0 workers (a rank's default), the state a rank handed out after every
batch until now (``state_dict()``, with the packing buffers' encoded samples) against the one it
hands out now (``state_dict_deferring()``, without them: a checkpoint completes its own state
once), on one loader after each of ``state_batches`` batches, alternating which runs first. A
sample's compaction is kept while the buffers hold it, so each complete state compacts only the
samples new since the one before: what a rank paid per batch.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.energon_bare import loader_kwargs
from benchmarks.settings import BenchSettings
from benchmarks.workload import Workload
from rl_data.energon.sft_dataloader import build_energon_sft_loader
from rl_data.energon.state_codec import encode_rank_state

WARM_UP_BATCHES = 4


def run(workload: Workload, settings: BenchSettings, tokenizer: Any) -> dict[str, Any]:
    """Per mode and worker count: state bytes, ms per state encoded in full / reusing, ratio."""
    results: dict[str, Any] = {}
    for mode in settings.modes:
        for workers in settings.state_worker_counts:
            results[f"{mode}/{workers}"] = _measure(workload, settings, tokenizer, packing=mode == "packed", workers=workers)
    return results


def _measure(workload: Workload, settings: BenchSettings, tokenizer: Any, *, packing: bool, workers: int) -> dict[str, Any]:
    loader = build_energon_sft_loader(
        processor=tokenizer, **loader_kwargs(workload, settings, packing=packing, workers=workers)
    )
    full_ms: list[float] = []
    reusing_ms: list[float] = []
    try:
        batches = iter(loader)
        stream = loader._stream
        for _ in range(WARM_UP_BATCHES):
            next(batches)
        for index in range(settings.state_batches):
            next(batches)
            state, cache = stream.energon_state(), stream.encoded_worker_states
            ways = [(full_ms, None), (reusing_ms, cache)]
            encoded = [_timed(state, way_cache, into) for into, way_cache in (ways if index % 2 else ways[::-1])]
            if encoded[0] != encoded[1]:
                raise AssertionError(f"batch {index}: reusing the cached checkpoints changed the state's bytes")
    finally:
        loader.close()
    full, reusing = statistics.median(full_ms), statistics.median(reusing_ms)
    return {
        "workers": workers,
        "batches": settings.state_batches,
        "state_bytes": len(encoded[0]),
        "full_ms": full,
        "reusing_ms": reusing,
        "full_vs_reusing": full / max(reusing, 1e-9),
    }


def _timed(state: Any, cache: Any, into: list[float]) -> bytes:
    begin = time.perf_counter()
    encoded = encode_rank_state(state, cache)
    into.append(1e3 * (time.perf_counter() - begin))
    return encoded


def deferred(workload: Workload, settings: BenchSettings, tokenizer: Any) -> dict[str, Any]:
    """Packed, 0 workers: bytes and ms per state, complete against deferred, and their ratio."""
    loader = build_energon_sft_loader(processor=tokenizer, **loader_kwargs(workload, settings, packing=True, workers=0))
    complete_ms: list[float] = []
    deferred_ms: list[float] = []
    try:
        batches = iter(loader)
        for _ in range(WARM_UP_BATCHES):
            next(batches)
        for index in range(settings.state_batches):
            next(batches)
            ways = [(complete_ms, loader.state_dict), (deferred_ms, lambda: loader.state_dict_deferring()[0])]
            states = {id(into): _timed_call(call, into) for into, call in (ways if index % 2 else ways[::-1])}
    finally:
        loader.close()
    complete, light = statistics.median(complete_ms), statistics.median(deferred_ms)
    return {
        "packed": {
            "batches": settings.state_batches,
            "complete_bytes": states[id(complete_ms)]["loader_state"].numel(),
            "deferred_bytes": states[id(deferred_ms)]["loader_state"].numel(),
            "complete_ms": complete,
            "deferred_ms": light,
            "complete_vs_deferred": complete / max(light, 1e-9),
        }
    }


def _timed_call(call: Any, into: list[float]) -> Any:
    begin = time.perf_counter()
    state = call()
    into.append(1e3 * (time.perf_counter() - begin))
    return state
