"""Helpers for tests: tiny real Energon datasets of real chitchat conversations.

Samples are written in shard order, so the keys of every split are known without reading the
dataset back: ``ChatDataset.split_keys[split]`` lists them in the order they were written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_data.energon.dataset_writer import DEFAULT_SPLITS, write_energon_dataset
from rl_data.energon.sample_format import encode_sample

#: Kinds of corrupt samples, each failing in the cooker for another reason.
#: ``build_energon_sft_loader`` arguments for one unpacked loader of logical rank 0 of 1;
#: tests add data_config, source, processor, batch size, length and split role.
SINGLE_RANK_UNPACKED = dict(
    logical_rank=0,
    logical_world_size=1,
    placement_fingerprint="placement-1",
    packing_algorithm=None,
    max_sequences_per_bin=None,
    sequence_length_pad_multiple=1,
    only_unmask_final=False,
)
CORRUPT_KINDS = ("invalid_json", "unknown_role", "empty_messages")


@dataclass(frozen=True)
class ChatDataset:
    """A prepared dataset on disk and what each of its splits holds."""

    root: Path
    #: Keys of every sample (good and corrupt) per split, in written order.
    split_keys: dict[str, list[str]]
    #: Keys of the corrupt samples per split.
    corrupt_keys: dict[str, list[str]] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return str(self.root)

    def good_keys(self, split: str) -> list[str]:
        corrupt = set(self.corrupt_keys.get(split, ()))
        return [k for k in self.split_keys[split] if k not in corrupt]


def sample_key(conversation: Mapping[str, Any], row: int) -> str:
    """The key a conversation is stored under (unique, WebDataset-safe)."""
    return f"chat-{row:05d}-{conversation['id'][:8]}"


def chat_members(
    conversation: Mapping[str, Any], row: int, *, max_messages: int = 4
) -> dict[str, bytes]:
    """The tar members of one SFT sample (first ``max_messages`` turns of the conversation)."""
    return encode_sample(
        {
            "kind": "sft",
            "messages": list(conversation["messages"][:max_messages]),
            "source": {"file": "chitchat", "row": row},
        }
    )


def corrupt_members(kind: str, row: int) -> dict[str, bytes]:
    """The tar members of a sample that the chat cooker must reject."""
    if kind == "invalid_json":
        return {"json": b'{"kind": "sft", "messages": [{"role": "user", '}
    if kind == "unknown_role":
        messages = [{"role": "robot", "content": "beep"}, {"role": "assistant", "content": "hi"}]
    elif kind == "empty_messages":
        messages = []
    else:
        raise ValueError(f"unknown corrupt kind {kind!r}; valid kinds are {CORRUPT_KINDS}")
    return {
        "json": json.dumps(
            {"kind": "sft", "messages": messages, "source": {"file": "corrupt", "row": row}}
        ).encode()
    }


def write_chat_dataset(
    root: str | Path,
    conversations: Sequence[Mapping[str, Any]],
    *,
    samples_per_shard: int,
    corrupt_rows: Sequence[int] = (),
    splits: Mapping[str, float] = DEFAULT_SPLITS,
    max_messages: int = 4,
) -> ChatDataset:
    """Write ``conversations`` as a prepared Energon dataset under ``root``.

    Rows in ``corrupt_rows`` are replaced by corrupt samples, cycling through
    :data:`CORRUPT_KINDS`.
    """
    corrupt_kind = {
        row: CORRUPT_KINDS[i % len(CORRUPT_KINDS)] for i, row in enumerate(corrupt_rows)
    }
    keys, samples = [], []
    for row, conversation in enumerate(conversations):
        key = sample_key(conversation, row)
        if row in corrupt_kind:
            key = f"corrupt-{row:05d}-{corrupt_kind[row].replace('_', '-')}"
            members = corrupt_members(corrupt_kind[row], row)
        else:
            members = chat_members(conversation, row, max_messages=max_messages)
        keys.append(key)
        samples.append((key, members))
    shards = write_energon_dataset(
        root, samples, samples_per_shard=samples_per_shard, splits=splits
    )
    split_keys = {}
    for split, shard_paths in shards.items():
        indices = [int(Path(p).stem.split("-")[1]) for p in shard_paths]
        split_keys[split] = [
            k for i in indices for k in keys[i * samples_per_shard : (i + 1) * samples_per_shard]
        ]
    corrupt = {
        split: [k for k in split_keys[split] if k.startswith("corrupt-")] for split in split_keys
    }
    return ChatDataset(root=Path(root), split_keys=split_keys, corrupt_keys=corrupt)


#: Packing arguments of ``build_energon_sft_loader`` for the small-dataset tests.
SMALL_PACKING = dict(
    packing_algorithm="first_fit_decreasing",
    max_sequences_per_bin=None,
    sequence_length_pad_multiple=8,
)


def make_loader(
    dataset: ChatDataset | str | Path | None,
    tokenizer: Any,
    *,
    energon: Mapping[str, Any] | None = None,
    source: Mapping[str, Any] | None = None,
    data_config: Mapping[str, Any] | None = None,
    workers: int | None = None,
    packing_buffer: int | None = None,
    role: str = "train",
    rank: int = 0,
    world: int = 1,
    batch_size: int = 4,
    max_sequence_length: int = 512,
    **arguments: Any,
) -> Any:
    """A shuffled loader of ``dataset`` (a :class:`ChatDataset` or its path; ``None`` when
    ``source`` names a mixture) for logical rank ``rank`` of ``world``: the train split (role
    ``"train"``) or the val split, virtual epochs of 4 batches, unpacked.

    ``energon``: the ``data_config["energon"]`` block; ``workers``: its ``num_workers``;
    ``packing_buffer``: its ``packing_buffer_size``, packing first-fit-decreasing into bins padded
    to 8 (:data:`SMALL_PACKING`); ``source`` and ``data_config``: fields added to (or replacing)
    the defaults; ``arguments``: ``build_energon_sft_loader`` arguments replacing the defaults (a
    ``split_role`` here keeps the split ``role`` chose).
    """
    from rl_data.energon.sft_dataloader import build_energon_sft_loader

    energon = dict(energon or {})
    if workers is not None:
        energon["num_workers"] = workers
    options = {**SINGLE_RANK_UNPACKED, "logical_rank": rank, "logical_world_size": world,
               "placement_fingerprint": f"placement-{world}"}
    if packing_buffer is not None:
        energon["packing_buffer_size"] = packing_buffer
        options.update(SMALL_PACKING)
    path = {} if dataset is None else {"path": str(getattr(dataset, "path", dataset))}
    split = "train" if role == "train" else "val"
    return build_energon_sft_loader(**{
        "data_config": {"energon": energon, "shuffle": True, **(data_config or {})},
        "source": {**path, "split": split, "virtual_epoch_length": 4, **(source or {})},
        "processor": tokenizer,
        "batch_size": batch_size,
        "max_sequence_length": max_sequence_length,
        "split_role": role,
        **options,
        **arguments,
    })


def build_small_train_loader(
    dataset: ChatDataset,
    tokenizer: Any,
    *,
    num_workers: int,
    packing: bool = False,
    epoch_mode: str = "exact",
    loop_length: int = 0,
    batch_size: int = 2,
    seed_offset: int = 0,
    prefetch_factor: int = 2,
) -> Any:
    """A train loader with small buffers over a small dataset (rank 0 of 1, shuffle on)."""
    energon = {"shuffle_buffer_size": 6, "max_samples_per_sequence": 2, "checkpoint_every_sec": 0.5,
               "seed_offset": seed_offset, "prefetch_factor": prefetch_factor}
    return make_loader(
        dataset, tokenizer, energon=energon, workers=num_workers, packing_buffer=6 if packing else None,
        source={"virtual_epoch_length": loop_length, "epoch_mode": epoch_mode}, batch_size=batch_size,
        max_sequence_length=128,
    )


def batch_source_ids(batch: Any) -> tuple[list[str], dict]:
    """Sample ids of a batch (flattened over packs) and no tensors: a cheap restore check view."""
    ids = batch["source_ids"]
    if ids and isinstance(ids[0], (list, tuple)):
        ids = [i for pack in ids for i in pack]
    return list(ids), {}
