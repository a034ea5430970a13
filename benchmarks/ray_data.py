"""Contender c: Ray Data ``read_text -> map_batches -> streaming_split -> iter_torch_batches``.

The JSONL rows are read as text, blocks in a seeded random order, encoded by an actor pool of
``parallelism`` actors (fractional CPUs: a whole CPU each deadlocks a 2-core cluster, see
``ray-facts.md``) running the same decoding, chat formatting and truncation as the task
encoder, and, when packing, the project's packer over each map batch of
``packing_buffer_size`` rows (output rows are packs). One split of ``streaming_split`` is
consumed by a separate consumer actor with ``iter_torch_batches`` and a padding collate.
Ray Data has no resumable iteration state: "restore" rebuilds the pipeline and skips the
batches consumed before the save, so all of them are replayed.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from benchmarks.encoding import collate_unpacked, encode_line, packs_of
from benchmarks.measure import RAY_TREE_INTERVAL_S, PeakMemory, consume
from benchmarks.settings import BenchSettings
from benchmarks.workload import Workload

MAP_ACTOR_CPUS = 0.5


class ChatEncoder:
    """``map_batches`` callable: text rows -> one row per sample (or per pack) of token arrays."""

    def __init__(self, settings_json: str, packing: bool) -> None:
        from rl_data.energon.task_encoders.adapter import ProcessorAdapter
        from rl_data.packing.algorithms import get_packer
        from rl_data.tokenization.tokenizer import load_qwen3_tokenizer

        self.settings = BenchSettings.model_validate_json(settings_json)
        self.adapter = ProcessorAdapter(load_qwen3_tokenizer(), self.settings.max_sequence_length)
        self.packer = None
        if packing:
            self.packer = get_packer(
                self.settings.packing_algorithm,
                self.settings.max_sequence_length,
                sequence_length_pad_multiple=self.settings.sequence_length_pad_multiple,
            )

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        samples = [encode_line(text, self.adapter) for text in batch["text"]]
        pad_multiple = self.settings.sequence_length_pad_multiple
        rows = []
        if self.packer is None:
            for sample in samples:
                row = collate_unpacked([sample], self.adapter, pad_multiple)
                tokens = row["num_tokens"]
                rows.append((row["input_ids"][0, :tokens], row["token_mask"][0, :tokens], [sample["id"]], tokens))
        else:
            for pack, ids in packs_of(samples, self.adapter, self.packer, pad_multiple):
                rows.append((pack["input_ids"], pack["token_mask"], ids, int(pack["cu_seqlens"][-1])))
        return {
            "input_ids": _ragged([r[0].numpy() for r in rows]),
            "token_mask": _ragged([r[1].numpy() for r in rows]),
            "ids": np.asarray([",".join(r[2]) for r in rows], dtype=object),
            "num_tokens": np.asarray([r[3] for r in rows], dtype=np.int64),
        }


def _ragged(arrays: list[np.ndarray]) -> np.ndarray:
    column = np.empty(len(arrays), dtype=object)
    column[:] = arrays
    return column


def pad_collate(batch: dict[str, np.ndarray], pad_token_id: int, pad_multiple: int) -> dict[str, Any]:
    """``iter_torch_batches`` collate: ragged rows -> right-padded tensors and counts."""
    lengths = [len(row) for row in batch["input_ids"]]
    width = -(-max(lengths) // pad_multiple) * pad_multiple
    input_ids = torch.full((len(lengths), width), pad_token_id, dtype=torch.long)
    token_mask = torch.zeros((len(lengths), width), dtype=torch.float32)
    for row, (ids, mask, length) in enumerate(zip(batch["input_ids"], batch["token_mask"], lengths)):
        input_ids[row, :length] = torch.from_numpy(np.asarray(ids))
        token_mask[row, :length] = torch.from_numpy(np.asarray(mask))
    ids = [key for joined in batch["ids"] for key in str(joined).split(",")]
    return {
        "input_ids": input_ids,
        "token_mask": token_mask,
        "sample_mask": token_mask.any(dim=1).to(torch.float32),
        "input_lengths": torch.tensor(lengths, dtype=torch.int32),
        "ids": ids,
        "num_samples": len(ids),
        "num_tokens": int(batch["num_tokens"].sum()),
    }


def build_split(workload: Workload, settings: BenchSettings, *, packing: bool) -> Any:
    """The pipeline's single ``streaming_split`` iterator (deterministic order)."""
    import ray.data
    from ray.data import ActorPoolStrategy, DataContext

    DataContext.get_current().execution_options.preserve_order = True
    dataset = (
        ray.data.read_text(list(workload.jsonl_paths))
        .randomize_block_order(seed=settings.seed)
        .map_batches(
            ChatEncoder,
            fn_constructor_kwargs={"settings_json": settings.model_dump_json(), "packing": packing},
            batch_size=settings.packing_buffer_size if packing else settings.batch_size,
            compute=ActorPoolStrategy(size=settings.parallelism),
            num_cpus=MAP_ACTOR_CPUS,
        )
    )
    return dataset.streaming_split(1, equal=False)[0]


class RayDataConsumer:
    """The trainer side: iterates one split with ``iter_torch_batches`` (run as a Ray actor)."""

    def __init__(self, settings_json: str, pad_token_id: int) -> None:
        self.settings = BenchSettings.model_validate_json(settings_json)
        self.pad_token_id = pad_token_id

    def _batches(self, split: Any, packing: bool):
        return iter(
            split.iter_torch_batches(
                batch_size=self.settings.batch_size,
                collate_fn=lambda b: pad_collate(b, self.pad_token_id, self.settings.sequence_length_pad_multiple),
                drop_last=True,
                prefetch_batches=2,
            )
        )

    def measure(self, split: Any, packing: bool, start_wall: float) -> dict[str, Any]:
        batches = self._batches(split, packing)
        start = time.perf_counter() - (time.time() - start_wall)
        return consume(
            lambda: next(batches),
            start=start,
            samples_target=self.settings.samples_per_run,
            wait_steps=self.settings.wait_steps,
            step_factor=self.settings.train_step_factor,
        )

    def skip_then_first(self, split: Any, packing: bool, skip: int) -> list[str]:
        batches = self._batches(split, packing)
        for _ in range(skip):
            next(batches)
        return next(batches)["ids"]


def run(workload: Workload, settings: BenchSettings, *, packing: bool, tokenizer: Any) -> dict[str, Any]:
    """Measure contender c; Ray must be initialised by the caller."""
    import ray

    timeout = settings.ray_timeout_s
    consumer = ray.remote(num_cpus=0)(RayDataConsumer).remote(
        settings.model_dump_json(), int(tokenizer.pad_token_id)
    )
    with PeakMemory(RAY_TREE_INTERVAL_S) as memory:
        start_wall = time.time()
        split = build_split(workload, settings, packing=packing)
        result = ray.get(consumer.measure.remote(split, packing, start_wall), timeout=timeout)
    begin = time.perf_counter()
    split = build_split(workload, settings, packing=packing)
    result["rebuild_s"] = time.perf_counter() - begin
    begin = time.perf_counter()
    skipped = result["batches_before_save"]
    first = ray.get(consumer.skip_then_first.remote(split, packing, skipped), timeout=timeout)
    result["checkpoint_restore_s"] = time.perf_counter() - begin
    result["restore_exact"] = first == result.pop("expected_ids_after_restore")
    result["batches_replayed_on_restore"] = skipped
    result["checkpoint_save_s"] = None
    result["checkpoint_bytes"] = None
    result["peak_memory_mb"] = memory.peak_mb
    result["cpu_layout"] = f"{settings.parallelism} map actors x {MAP_ACTOR_CPUS} CPU + read tasks + 1 consumer actor"
    ray.kill(consumer)
    return result
