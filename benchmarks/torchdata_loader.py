"""Contender d: torchdata ``StatefulDataLoader`` over a map-style dataset doing the same encoding.

The way Ray-based RL frameworks commonly load SFT data: the JSONL rows in memory, a map-style
``Dataset`` whose ``__getitem__`` decodes and chat-formats one row, a shuffled
``StatefulDataLoader`` with ``parallelism`` worker processes and a ``collate_fn`` that pads (or
packs one buffer of ``packing_buffer_size`` samples with the project's packer, so a packed
batch holds that buffer's packs). Runs in a fresh process (:mod:`benchmarks.fresh_process`):
the clock includes loading the tokenizer and the JSONL rows. Checkpoint: ``state_dict()`` (sampler position and worker
states), restore: a fresh loader, ``load_state_dict``, first batch; the sampler skips ahead
without loading data, so no batch is replayed. Building the fresh loader is timed apart
(``rebuild_s``).

``workers`` (default ``parallelism``) sets ``num_workers``; 0 loads in the calling process (the
worker sweep). Over a :class:`benchmarks.vlm.VlmWorkload` the dataset is
:class:`JsonlVlmDataset`: the JSON line in memory, the JPEG read from its file, and the
``vlm_sft`` cooker and encoder's per-sample work (:class:`benchmarks.vlm.VlmSampleEncoder`);
the collate is the encoder's batch made a training batch, in the workers. ``restore=False``
skips the checkpoint and restore (sweep runs measure throughput only).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from benchmarks.encoding import collate_packed, collate_unpacked, encode_line
from benchmarks.measure import PeakMemory, SavedState, consume
from benchmarks.settings import BenchSettings
from benchmarks.vlm import VlmSampleEncoder, VlmWorkload, touch_media
from benchmarks.workload import Workload
from rl_data.energon.task_encoders.adapter import ProcessorAdapter
from rl_data.packing.algorithms import get_packer
from rl_data.tokenization.tokenizer import load_qwen3_tokenizer


class JsonlChatDataset(Dataset):
    """Rows of JSONL files held in memory; ``__getitem__`` encodes one conversation."""

    def __init__(self, paths: tuple[str, ...], adapter: ProcessorAdapter) -> None:
        self.lines = [line for path in paths for line in Path(path).read_bytes().splitlines() if line]
        self.adapter = adapter

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return encode_line(self.lines[index], self.adapter)


class JsonlVlmDataset(Dataset):
    """VLM JSONL rows in memory, each sample's JPEG read from its file; ``__getitem__`` encodes one sample."""

    def __init__(self, workload: VlmWorkload, encoder: VlmSampleEncoder) -> None:
        self.lines = [line for path in workload.jsonl_paths for line in Path(path).read_bytes().splitlines() if line]
        self.images = Path(workload.images_dir)
        self.encoder = encoder

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, index: int) -> Any:
        from benchmarks.vlm import sample_key

        key = sample_key(index)
        return self.encoder.encode(key, self.lines[index], (self.images / f"{key}.jpg").read_bytes())


def _collate(samples, *, adapter: ProcessorAdapter, packer, pad_multiple: int) -> dict[str, Any]:
    if packer is None:
        return collate_unpacked(samples, adapter, pad_multiple)
    return collate_packed(samples, adapter, packer, pad_multiple)


def build_loader(
    workload: Workload | VlmWorkload, settings: BenchSettings, *, packing: bool, tokenizer: Any, workers: int | None = None
) -> StatefulDataLoader:
    """The shuffled loader (seeded, so a restored one continues the same order); ``workers``:
    ``num_workers`` (None: ``parallelism``); for a VLM workload ``tokenizer`` is its
    :class:`~benchmarks.vlm.VlmSampleEncoder`."""
    workers = settings.parallelism if workers is None else workers
    generator = torch.Generator()
    generator.manual_seed(settings.seed)
    if isinstance(workload, VlmWorkload):
        return StatefulDataLoader(
            JsonlVlmDataset(workload, tokenizer),
            batch_size=settings.vlm_batch_size,
            shuffle=True,
            generator=generator,
            num_workers=workers,
            collate_fn=tokenizer.collate,
            drop_last=True,
            persistent_workers=False,
        )
    adapter = ProcessorAdapter(tokenizer, settings.max_sequence_length)
    packer = (
        get_packer(
            settings.packing_algorithm,
            settings.max_sequence_length,
            sequence_length_pad_multiple=settings.sequence_length_pad_multiple,
        )
        if packing
        else None
    )
    return StatefulDataLoader(
        JsonlChatDataset(workload.jsonl_paths, adapter),
        batch_size=settings.packing_buffer_size if packing else settings.batch_size,
        shuffle=True,
        generator=generator,
        num_workers=workers,
        collate_fn=functools.partial(
            _collate, adapter=adapter, packer=packer, pad_multiple=settings.sequence_length_pad_multiple
        ),
        drop_last=True,
        persistent_workers=False,
    )


def run(
    workload: Workload | VlmWorkload,
    settings: BenchSettings,
    *,
    packing: bool,
    start: float,
    workers: int | None = None,
    restore: bool = True,
) -> dict[str, Any]:
    """Measure contender d (see :func:`benchmarks.measure.consume`); ``start``: when the clock started;
    ``workers``: DataLoader workers (None: ``parallelism``, 0: in-process)."""
    saved = SavedState()
    workers = settings.parallelism if workers is None else workers
    vlm = isinstance(workload, VlmWorkload)
    layout = f"1 fresh process + {workers} DataLoader workers" if workers else "1 fresh process, in-process loading"

    with PeakMemory() as memory:
        tokenizer = VlmSampleEncoder(settings) if vlm else load_qwen3_tokenizer()
        loader = build_loader(workload, settings, packing=packing, tokenizer=tokenizer, workers=workers)
        batches = iter(loader)
        result = consume(
            (lambda: touch_media(next(batches))) if vlm else (lambda: next(batches)),
            start=start,
            samples_target=settings.vlm_samples_per_run if vlm else settings.samples_per_run,
            wait_steps=settings.wait_steps,
            step_factor=settings.train_step_factor,
            save=(lambda: saved.save(loader.state_dict())) if restore else None,
        )
    batches = None  # the iterator (and its workers) goes before the restore
    result["peak_memory_mb"] = memory.peak_mb
    result["cpu_layout"] = layout
    if not restore:
        result.pop("expected_ids_after_restore")
        return result
    begin = time.perf_counter()
    restored = build_loader(workload, settings, packing=packing, tokenizer=tokenizer, workers=workers)
    result["rebuild_s"] = time.perf_counter() - begin
    begin = time.perf_counter()
    restored.load_state_dict(saved.load(weights_only=False))
    restored_batches = iter(restored)
    first = next(restored_batches)
    result["checkpoint_restore_s"] = time.perf_counter() - begin
    del restored_batches
    result["restore_exact"] = first["ids"] == result.pop("expected_ids_after_restore")
    result["batches_replayed_on_restore"] = 0 if result["restore_exact"] else None
    result["checkpoint_bytes"] = len(saved.data)
    return result
