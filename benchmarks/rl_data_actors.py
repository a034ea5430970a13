"""Contender b: rl_data rank actors + coordinator, consumed by a separate actor through object refs.

``start_data_coordinator`` with N logical ranks (one rank actor each, prefetching, fractional
CPUs so N ranks share ``parallelism`` CPUs); a consumer actor (the trainer) gets each step
(one batch ref per rank) from the coordinator, fetches the batches from the object store and
turns them into training tensors. It does so the way a trainer overlaps data with compute,
through ``rl_data.distributed.StepPrefetcher``: one background thread keeps the next step
ready, asking ``next_step(commit=k)`` (commit the step trained last and get the next one: one
round trip per step), so committed steps are always steps the trainer finished. Checkpoint: the coordinator's ``save_checkpoint`` after the
throughput phase, once the last consumed step is committed; restore: a fresh coordinator
(same config), ``load_checkpoint``, first step, compared with the step that followed the save
(exact means no batch replayed). ``rebuild_s`` is the fresh coordinator's start (actors,
loaders), timed apart. The consumer actor (the trainer, with its tokenizer for the padding)
is ready before the clock starts; the rank actors load their own tokenizers inside it.

``workers`` sets each rank's Energon worker processes (``data_config["energon"]["num_workers"]``);
a rank actor then reserves ``min(max(1, workers), parallelism / ranks)`` CPUs (bundle and
actor): one per process that works, at most the machine's share of the rank. Over a
:class:`benchmarks.vlm.VlmWorkload` the ranks run the ``vlm_sft`` task with the multimodal
processor, and the consumer makes :func:`benchmarks.vlm.vlm_training_batch` of each batch and
reads its pixels. ``restore=False`` skips the checkpoint, rebuild and restore (sweep runs).
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

from benchmarks.encoding import merge_step, training_batch
from benchmarks.energon_bare import loader_kwargs
from benchmarks.measure import RAY_TREE_INTERVAL_S, PeakMemory, consume
from benchmarks.settings import BenchSettings
from benchmarks.vlm import VlmWorkload, touch_media, vlm_training_batch
from benchmarks.workload import Workload

NAMESPACE = "rl_data_bench"


class CoordinatorConsumer:
    """The trainer side (run as a Ray actor): a ``StepPrefetcher`` keeps the next step ready."""

    def __init__(self, settings_json: str, vlm: bool = False) -> None:
        from rl_data.energon.task_encoders.adapter import ProcessorAdapter
        from rl_data.tokenization.tokenizer import load_qwen3_tokenizer

        self.settings = BenchSettings.model_validate_json(settings_json)
        self.vlm = vlm
        if vlm:  # the rank actors' processor: its tokenizer has the media placeholder tokens
            from rl_data.energon.multimodal.task_encoders.processor import load_default_multimodal_processor

            tokenizer, length = load_default_multimodal_processor().tokenizer, self.settings.vlm_max_sequence_length
        else:
            tokenizer, length = load_qwen3_tokenizer(), self.settings.max_sequence_length
        self.adapter = ProcessorAdapter(tokenizer, length)
        self.samples_target = self.settings.vlm_samples_per_run if vlm else self.settings.samples_per_run

    def _batch(self, batch: Any) -> dict[str, Any]:
        pad_multiple = self.settings.sequence_length_pad_multiple
        if self.vlm:
            return vlm_training_batch(batch, self.adapter, pad_multiple)
        return training_batch(batch, self.adapter, pad_multiple)

    def _training_step(self, batches: list[Any]) -> dict[str, Any]:
        converted = [self._batch(b) for b in batches]
        step = merge_step(converted)
        if self.vlm:
            touch_media({"batches": converted})
        return step

    def measure(self, coordinator: Any, start_wall: float, checkpoint_dir: str | None) -> dict[str, Any]:
        import ray

        from rl_data.distributed.step_prefetcher import StepPrefetcher

        start = time.perf_counter() - (time.time() - start_wall)
        timeout = self.settings.ray_timeout_s
        with StepPrefetcher(coordinator, transform=self._training_step, timeout_s=timeout) as steps:

            def save() -> None:  # the trainer finished the last step it took: commit it, then save
                steps.commit_trained()
                ray.get(coordinator.save_checkpoint.remote(checkpoint_dir), timeout=timeout)

            return consume(
                lambda: next(steps)[1],
                start=start,
                samples_target=self.samples_target,
                wait_steps=self.settings.wait_steps,
                step_factor=self.settings.train_step_factor,
                save=save if checkpoint_dir is not None else None,
            )

    def restore_then_first(self, coordinator: Any, checkpoint_dir: str) -> tuple[list[str], float]:
        import ray

        timeout = self.settings.ray_timeout_s
        begin = time.perf_counter()
        ray.get(coordinator.load_checkpoint.remote(checkpoint_dir), timeout=timeout)
        _, refs = ray.get(coordinator.next_step.remote(), timeout=timeout)
        batches = [self._batch(b) for b in ray.get(refs, timeout=timeout)]
        return merge_step(batches)["ids"], time.perf_counter() - begin


def rank_cpus(settings: BenchSettings, ranks: int, workers: int) -> float:
    """CPUs one rank actor reserves: one per working process, capped at its share of the machine."""
    return min(float(max(1, workers)), settings.parallelism / ranks)


def _start(
    workload: Workload | VlmWorkload, settings: BenchSettings, *, packing: bool, ranks: int, name: str, workers: int = 0
) -> Any:
    from rl_data.distributed.config import LoaderSpec, ParallelLayout, RuntimeConfig
    from rl_data.distributed.coordinator import start_data_coordinator

    if isinstance(workload, VlmWorkload):
        from benchmarks.vlm import loader_kwargs as vlm_loader_kwargs

        kwargs = vlm_loader_kwargs(workload, settings, workers=workers)
    else:
        kwargs = loader_kwargs(workload, settings, packing=packing, workers=workers)
        for topology_key in ("logical_rank", "logical_world_size", "placement_fingerprint"):
            kwargs.pop(topology_key)
    cpus = rank_cpus(settings, ranks, workers)
    config = RuntimeConfig(
        parallel_layout=ParallelLayout(dp=ranks),
        bundle_resources={"CPU": cpus},
        rank_actor_num_cpus=cpus,
        namespace=NAMESPACE,
        name=name,
        step_timeout_s=settings.ray_timeout_s,
        control_timeout_s=settings.ray_timeout_s,
    )
    return start_data_coordinator(config, LoaderSpec(**kwargs))


def _stop(coordinator: Any, timeout: float) -> None:
    import ray

    ray.get(coordinator.shutdown.remote(), timeout=timeout)
    ray.kill(coordinator, no_restart=True)


def run(
    workload: Workload | VlmWorkload,
    settings: BenchSettings,
    *,
    packing: bool,
    ranks: int,
    workers: int = 0,
    restore: bool = True,
) -> dict[str, Any]:
    """Measure contender b with ``ranks`` logical ranks of ``workers`` Energon workers each; Ray
    must be initialised by the caller."""
    import ray

    timeout = settings.ray_timeout_s
    vlm = isinstance(workload, VlmWorkload)
    name = f"bench-{ranks}-{workers}-{int(packing)}-{time.time_ns()}"
    layout = (
        f"{ranks} rank actor(s) x {rank_cpus(settings, ranks, workers):g} CPU, {workers} Energon worker(s) each"
        " + coordinator + consumer"
    )
    consumer = ray.remote(num_cpus=0)(CoordinatorConsumer).remote(settings.model_dump_json(), vlm)
    ray.get(consumer.__ray_ready__.remote(), timeout=timeout)
    if not restore:
        with PeakMemory(RAY_TREE_INTERVAL_S) as memory:
            start_wall = time.time()
            coordinator = _start(workload, settings, packing=packing, ranks=ranks, name=name, workers=workers)
            result = ray.get(consumer.measure.remote(coordinator, start_wall, None), timeout=timeout * 4)
        _stop(coordinator, timeout)
        result.pop("expected_ids_after_restore")
        result["peak_memory_mb"] = memory.peak_mb
        result["cpu_layout"] = layout
        ray.kill(consumer)
        return result
    with tempfile.TemporaryDirectory(prefix="rl_data_bench_ckpt-") as checkpoint_dir:
        with PeakMemory(RAY_TREE_INTERVAL_S) as memory:
            start_wall = time.time()
            coordinator = _start(workload, settings, packing=packing, ranks=ranks, name=name, workers=workers)
            result = ray.get(consumer.measure.remote(coordinator, start_wall, checkpoint_dir), timeout=timeout * 4)
        _stop(coordinator, timeout)
        begin = time.perf_counter()
        coordinator = _start(workload, settings, packing=packing, ranks=ranks, name=name + "-restored", workers=workers)
        result["rebuild_s"] = time.perf_counter() - begin
        first, result["checkpoint_restore_s"] = ray.get(
            consumer.restore_then_first.remote(coordinator, checkpoint_dir), timeout=timeout
        )
        _stop(coordinator, timeout)
    result["restore_exact"] = first == result.pop("expected_ids_after_restore")
    result["batches_replayed_on_restore"] = 0 if result["restore_exact"] else None
    result["peak_memory_mb"] = memory.peak_mb
    result["cpu_layout"] = layout
    ray.kill(consumer)
    return result
