"""Validated configuration blocks of the Energon SFT loader.

``EnergonSourceConfig`` says *which* data a loader reads (a prepared Energon dataset and one of
its splits); ``EnergonLoaderConfig`` says *how* it reads it (workers, shuffling, packing buffer,
task encoder, failure budget). Both reject unknown keys, and every error names the field.

Fields that change which samples a shard yields or how they are encoded go into the loader
identity (see :func:`rl_data.energon.identity._loader_identity`); the runtime-only fields listed
in :attr:`EnergonLoaderConfig.RUNTIME_ONLY_FIELDS` (prefetching, internal checkpoint period,
watchdog, failure budget) can change between a save and a restore.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


class EnergonSourceConfig(BaseModel):
    """One prepared Energon dataset and the split a loader reads from it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Root of a prepared dataset (the folder that holds ``.nv-meta``); local or an Energon EPath.
    path: str = Field(min_length=1)
    #: Energon split part, as written by ``energon prepare``: ``"train"``, ``"val"`` or ``"test"``.
    split: str = Field(min_length=1)
    #: Training only: batches per ``for`` loop. 0 (``epoch_mode="exact"`` only): one ``for``
    #: loop is one pass. > 0: every ``for`` loop yields this many batches of the endless stream.
    virtual_epoch_length: int = Field(default=0, ge=0)
    #: Validation only: stop after this many batches (None: the whole split).
    limit: int | None = Field(default=None, ge=1)
    #: Training only. ``"exact"``: the rank reads its share in passes, every sample once per
    #: pass, in a new deterministic order each pass; each worker drops (and counts) the last
    #: partial batch of its pass. ``"virtual"``: Energon repeats the share forever and its
    #: shuffle buffer mixes consecutive passes, so any pass-sized window holds some samples
    #: twice and misses others; nothing is dropped. See README "Epoch modes".
    epoch_mode: Literal["exact", "virtual"] = "exact"


class EnergonLoaderConfig(BaseModel):
    """How one logical data shard is read, encoded and checked for bad samples."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Fields that do not change the sample stream, so a restore may change them.
    RUNTIME_ONLY_FIELDS: ClassVar[tuple[str, ...]] = (
        "prefetch_factor",
        "checkpoint_every_sec",
        "watchdog_timeout_seconds",
        "max_consecutive_failures",
        "max_failure_ratio",
        "failure_ratio_min_samples",
    )

    #: Worker processes per loader (0: load in the calling process).
    num_workers: int = Field(default=0, ge=0)
    #: Samples in Energon's shuffle buffer (None disables sample shuffling).
    shuffle_buffer_size: int | None = Field(default=100, ge=1)
    #: Samples read in sequence from one shard before jumping (None: whole shard slices).
    max_samples_per_sequence: int | None = Field(default=100, ge=1)
    #: Samples the packer chooses from (None: packing off).
    packing_buffer_size: int | None = Field(default=None, ge=1)
    #: Added to the worker seeds (changes the shuffle order).
    seed_offset: int = Field(default=0, ge=0)
    #: Batches prefetched per worker.
    prefetch_factor: int = Field(default=2, ge=1)
    #: Period of the workers' internal checkpoints; a restore replays at most this much work.
    checkpoint_every_sec: float = Field(default=60.0, gt=0)
    #: Energon prints a stack trace when a batch takes longer (None disables the watchdog).
    watchdog_timeout_seconds: float | None = Field(default=60.0, gt=0)
    #: Registered name of the task encoder (see ``rl_data.energon.task_encoders``).
    task_encoder: str = Field(default="chat_sft", min_length=1)
    #: Registered name of the cooker turning raw samples into canonical ones (None: the
    #: task encoder's default).
    cooker: str | None = Field(default=None, min_length=1)
    #: Consecutive failures of one pipeline stage that are fatal (Energon's tolerance).
    max_consecutive_failures: int = Field(default=100, ge=1)
    #: Fatal once skipped / (skipped + delivered) exceeds this ...
    max_failure_ratio: float = Field(default=0.1, gt=0, le=1)
    #: ... after at least this many samples were seen.
    failure_ratio_min_samples: int = Field(default=100, ge=1)

    def identity_dump(self) -> dict[str, Any]:
        """The fields that pin the sample stream, as plain JSON."""
        return self.model_dump(mode="json", exclude=set(self.RUNTIME_ONLY_FIELDS))


def _describe_errors(error: Any) -> str:
    parts = []
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or "<block>"
        if item["type"] == "missing":
            parts.append(f"{field}: {item['msg']}")
        else:
            parts.append(f"{field}={item.get('input')!r}: {item['msg']}")
    return "; ".join(parts)


def validate_block(model: type[BaseModel], value: Any, *, name: str) -> Any:
    """Validate ``value`` as ``model``; a ``ValueError`` names the block, field, value and rule."""
    from pydantic import ValidationError

    if isinstance(value, model):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{name} must be a mapping of {model.__name__} fields "
            f"({', '.join(model.model_fields)}), got {type(value).__name__}: {value!r}"
        )
    try:
        return model.model_validate(dict(value))
    except ValidationError as error:
        allowed = ", ".join(model.model_fields)
        raise ValueError(
            f"invalid {name} ({model.__name__}): {_describe_errors(error)} "
            f"(allowed fields: {allowed})"
        ) from None
