"""Contender a: the bare Energon loader with the project's task encoder, in this process.

One ``build_energon_sft_loader`` (0 worker processes) for logical rank 0 of 1: the per-rank
ceiling every distributed layer is measured against. Runs in a fresh process
(:mod:`benchmarks.fresh_process`): the clock includes loading the tokenizer. Checkpoint: ``state_dict()`` serialised
with ``torch.save``; restore: a fresh loader with the same arguments, ``load_state_dict``,
first batch (exact, so no batch is replayed); building the fresh loader is timed apart
(``rebuild_s``). Its CPU time from the first batch to the last of the throughput phase
(``steady_non_pad_tokens_per_cpu_s``) is compared with the chat formatting alone (``micro.py``).
"""

from __future__ import annotations

import time
from typing import Any


from benchmarks.encoding import training_batch
from benchmarks.measure import PeakMemory, SavedState, consume
from benchmarks.settings import BenchSettings
from benchmarks.workload import Workload
from rl_data.energon.sft_dataloader import build_energon_sft_loader
from rl_data.energon.task_encoders.adapter import ProcessorAdapter
from rl_data.tokenization.tokenizer import load_qwen3_tokenizer

PLACEMENT = "benchmark-placement"
#: Batches per virtual epoch: more than any run consumes (Energon builds a list of this length).
VIRTUAL_EPOCH_BATCHES = 100_000


def loader_kwargs(
    workload: Workload, settings: BenchSettings, *, packing: bool, rank: int = 0, world_size: int = 1, workers: int = 0
) -> dict[str, Any]:
    """``build_energon_sft_loader`` arguments (without ``processor``) shared by contenders a and b;
    ``workers``: Energon worker processes (``data_config["energon"]["num_workers"]``)."""
    energon: dict[str, Any] = {"shuffle_buffer_size": 100, "max_samples_per_sequence": 100, "num_workers": workers}
    if packing:
        energon["packing_buffer_size"] = settings.packing_buffer_size
    return dict(
        data_config={"energon": energon, "shuffle": True},
        source={"path": workload.energon_path, "split": "train", "virtual_epoch_length": VIRTUAL_EPOCH_BATCHES},
        batch_size=settings.batch_size,
        max_sequence_length=settings.max_sequence_length,
        split_role="train",
        logical_rank=rank,
        logical_world_size=world_size,
        placement_fingerprint=PLACEMENT,
        packing_algorithm=settings.packing_algorithm if packing else None,
        max_sequences_per_bin=None,
        sequence_length_pad_multiple=settings.sequence_length_pad_multiple,
        only_unmask_final=False,
    )


def run(workload: Workload, settings: BenchSettings, *, packing: bool, start: float) -> dict[str, Any]:
    """Measure contender a (see :func:`benchmarks.measure.consume`); ``start``: when the clock started."""
    kwargs = loader_kwargs(workload, settings, packing=packing)
    pad_multiple = settings.sequence_length_pad_multiple
    saved = SavedState()

    with PeakMemory() as memory:
        tokenizer = load_qwen3_tokenizer()
        adapter = ProcessorAdapter(tokenizer, settings.max_sequence_length)
        loader = build_energon_sft_loader(processor=tokenizer, **kwargs)
        batches = iter(loader)
        result = consume(
            lambda: training_batch(next(batches), adapter, pad_multiple),
            start=start,
            samples_target=settings.samples_per_run,
            wait_steps=settings.wait_steps,
            step_factor=settings.train_step_factor,
            save=lambda: saved.save(loader.state_dict()),
            cpu_clock=True,
        )
    begin = time.perf_counter()
    restored = build_energon_sft_loader(processor=tokenizer, **kwargs)
    result["rebuild_s"] = time.perf_counter() - begin
    begin = time.perf_counter()
    restored.load_state_dict(saved.load(weights_only=True))
    first = training_batch(next(iter(restored)), adapter, pad_multiple)
    result["checkpoint_restore_s"] = time.perf_counter() - begin
    result["restore_exact"] = first["ids"] == result.pop("expected_ids_after_restore")
    result["batches_replayed_on_restore"] = 0 if result["restore_exact"] else None
    result["checkpoint_bytes"] = len(saved.data)
    result["peak_memory_mb"] = memory.peak_mb
    result["cpu_layout"] = "1 fresh process, 0 Energon workers"
    return result
