"""Validated configuration blocks of the Energon SFT loader.

``EnergonSourceConfig`` says *which* data a loader reads (a prepared Energon dataset and one of
its splits); ``EnergonLoaderConfig`` says *how* it reads it (workers, shuffling, packing buffer,
task encoder, failure budget); ``DataConfig`` is the whole ``data_config`` (that block plus the
formatting flags, the ``TaskDataSpec`` prompts and the task's own options). All reject unknown
keys, and every error names the field: a misspelt key fails on the driver, before any actor.

Fields that change which samples a shard yields or how they are encoded go into the loader
identity (see :func:`rl_data.energon.identity._loader_identity`); the runtime-only fields listed
in :attr:`EnergonLoaderConfig.RUNTIME_ONLY_FIELDS` (prefetching, internal checkpoint period,
watchdog, failure budget) can change between a save and a restore.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rl_data.config_blocks import validate_block
from rl_data.task_registry import get_task


class MixtureMember(BaseModel):
    """One dataset of a weighted mixture: a name (unique in the mixture), its path and weight."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        min_length=1, pattern=r"^[A-Za-z0-9_.-]+$",
        description="The member's name (letters, digits, '_', '.', '-'; unique in the mixture), used in metrics and the identity.",
    )  # fmt: skip
    path: str = Field(min_length=1, description="Root of a prepared dataset (absolute: every node reads it).")
    weight: float = Field(
        gt=0, description="Relative weight (> 0): a sample comes from this member with probability weight / sum of weights."
    )


class EnergonSourceConfig(BaseModel):
    """The data a loader reads: one prepared Energon dataset (or an Energon metadataset YAML),
    or a weighted ``mixture`` of datasets, and the split it reads from each."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str | None = Field(
        default=None, min_length=1,
        description="A prepared dataset (the folder holding .nv-meta) or an Energon metadataset .yaml, local or an "
        "Energon URL; leave unset when mixture is given.",
    )  # fmt: skip
    mixture: tuple[MixtureMember, ...] | None = Field(
        default=None, min_length=1,
        description="Datasets sampled by weight, blended sample by sample and deterministically; leave unset when path is given.",
    )  # fmt: skip
    split: str = Field(min_length=1, description="The split part to read, as the dataset names it: 'train', 'val' or 'test'.")
    virtual_epoch_length: int = Field(
        default=0, ge=0,
        description="Training only: batches per for loop; 0 (epoch_mode 'exact' only): one pass per for loop.",
    )  # fmt: skip
    limit: int | None = Field(
        default=None, ge=1, description="Validation only: stop after this many batches (None: the whole split)."
    )
    epoch_mode: Literal["exact", "virtual"] = Field(
        default="exact",
        description="Training only: 'exact' reads every sample once per pass, in a new order each pass (each worker "
        "drops its last partial batch); 'virtual' repeats the data forever, so a pass-sized window may repeat or "
        "miss samples.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> "EnergonSourceConfig":
        if (self.path is None) == (self.mixture is None):
            raise ValueError("give exactly one of path (a dataset or metadataset) and mixture (datasets with weights)")
        if self.mixture is not None:
            names = [m.name for m in self.mixture]
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                raise ValueError(f"mixture member names must be unique, found {repeated} more than once")
        return self

    @property
    def is_mixture(self) -> bool:
        """Several datasets sampled by weight (a ``mixture``, or a metadataset YAML)."""
        return self.mixture is not None or str(self.path).endswith((".yaml", ".yml"))

    def energon_source(self) -> Any:
        """What Energon's ``get_train_dataset`` / ``get_val_dataset`` read: the path, or for a
        ``mixture`` a metadataset (a ``blend`` of the members, as a mapping)."""
        if self.mixture is None:
            return self.path
        blend = [{"path": m.path, "weight": m.weight} for m in self.mixture]
        return {"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {self.split: {"blend": blend}}}

    def describe(self) -> str:
        """A short name for messages: the path, or ``mixture(name=weight, ...)``."""
        if self.mixture is None:
            return str(self.path)
        return "mixture(" + ", ".join(f"{m.name}={m.weight:g}" for m in self.mixture) + ")"


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

    num_workers: int = Field(default=0, ge=0, description="Worker processes per loader (0: load in the calling process).")
    shuffle_buffer_size: int | None = Field(
        default=100, ge=1, description="Samples in Energon's shuffle buffer (None disables sample shuffling)."
    )
    max_samples_per_sequence: int | None = Field(
        default=100, ge=1, description="Samples read in sequence from one shard before jumping (None: whole shard slices)."
    )
    packing_buffer_size: int | None = Field(
        default=None, ge=1, description="Samples the packer chooses from (None: packing off)."
    )
    seed_offset: int = Field(default=0, ge=0, description="Added to the worker seeds (changes the shuffle order).")
    prefetch_factor: int = Field(default=2, ge=1, description="Batches prefetched per worker.")
    checkpoint_every_sec: float = Field(
        default=0.0, ge=0,
        description="Least seconds between a worker's internal checkpoints; a restore replays the batches since the "
        "last one (0: after every batch, so a restore replays nothing).",
    )  # fmt: skip
    watchdog_timeout_seconds: float | None = Field(
        default=60.0, gt=0,
        description="Energon prints a stack trace when a batch takes longer than this (None disables the watchdog).",
    )  # fmt: skip
    task: str = Field(
        default="chat_sft", min_length=1,
        description="The task: a name registered in rl_data.tasks or 'pkg.module:TASK' (its encoder, cookers and options).",
    )  # fmt: skip
    cooker: str | None = Field(
        default=None, min_length=1,
        description="Name of one of the task's cookers, turning raw samples into typed ones (None: the task's default).",
    )  # fmt: skip
    max_consecutive_failures: int = Field(
        default=100, ge=1, description="Consecutive failures of one pipeline stage that end the run (Energon's tolerance)."
    )
    max_failure_ratio: float = Field(
        default=0.1, gt=0, le=1,
        description="The run ends once skipped / (skipped + delivered) samples exceeds this share ...",
    )  # fmt: skip
    failure_ratio_min_samples: int = Field(
        default=100, ge=1, description="... after at least this many samples were seen."
    )

    @model_validator(mode="before")
    @classmethod
    def _former_task_key(cls, values: Any) -> Any:
        """``task_encoder`` (the key's former name) is read as ``task``, with a warning."""
        if not isinstance(values, Mapping) or "task_encoder" not in values:
            return values
        if "task" in values:
            raise ValueError(
                "data_config['energon'] has both 'task' and 'task_encoder' (its former name); keep 'task'"
            )
        warnings.warn(
            "data_config['energon']['task_encoder'] is deprecated: name the task with "
            "data_config['energon']['task'] (loader identities and checkpoints are the same)",
            FutureWarning,
            stacklevel=2,
        )
        values = dict(values)
        values["task"] = values.pop("task_encoder")
        return values

    @property
    def task_encoder(self) -> str:
        """The task's name under the key's former name."""
        return self.task

    def identity_dump(self) -> dict[str, Any]:
        """The fields that pin the sample stream, as plain JSON (the task's name under its former
        key, ``task_encoder``: identities of earlier checkpoints stay equal)."""
        dump = self.model_dump(mode="json", exclude=set(self.RUNTIME_ONLY_FIELDS) | {"task"})
        dump["task_encoder"] = self.task
        return dump


class DataConfig(BaseModel):
    """``data_config`` of ``build_energon_sft_loader``, validated (see :func:`validate_data_config`).

    ``batch_format`` is not part of the loader identity: a state restores under either form.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    energon: EnergonLoaderConfig = Field(description="How the Energon loader reads, encodes and checks the data.")
    shuffle: bool | None = Field(
        default=None, description="Must be True for a train loader (it always shuffles); unused for validation."
    )
    add_bos: bool = Field(default=True, description="Begin each sample with the tokenizer's BOS token (when it has one).")
    add_eos: bool = Field(default=True, description="End each sample with the tokenizer's EOS token.")
    add_generation_prompt: bool = Field(
        default=False, description="End the rendered chat with the assistant's generation prompt."
    )
    control_text: Literal["reject", "plain_text"] = Field(
        default="reject",
        description="Special tokens inside message text: 'reject' the sample, or encode them as 'plain_text'.",
    )
    prompt: str | None = Field(
        default=None, description="Applied with .format(text) to the first user turn (TaskDataSpec.prompt)."
    )
    system_prompt: str | None = Field(
        default=None,
        description="Inserted as the system turn when the conversation has none (TaskDataSpec.system_prompt).",
    )
    task: dict[str, Any] = Field(
        default_factory=dict, description="The task's own encoder options (its TaskConfig, checked by the task)."
    )
    batch_format: Literal["tensors", "message_log"] | None = Field(
        default=None,
        description="Unpacked SFT batches as padded tensors ('tensors') or message logs ('message_log'); None: the "
        "task's default (packed batches are always tensors).",
    )

    @model_validator(mode="before")
    @classmethod
    def _read_prompt_files(cls, values: Any) -> Any:
        """``prompt_file`` / ``system_prompt_file`` (``TaskDataSpec``'s keys) become the texts."""
        if not isinstance(values, Mapping):
            return values
        values = dict(values)
        for key in ("prompt", "system_prompt"):
            path = values.pop(f"{key}_file", None)
            if path is None:
                continue
            if values.get(key) is not None:
                raise ValueError(f"set either {key} or {key}_file, not both")
            from rl_data.interfaces import TaskDataSpec

            spec = TaskDataSpec(**{f"{key}_file": path})
            values[key] = getattr(spec, key)
        return values

    @field_validator("prompt")
    @classmethod
    def _prompt_takes_the_text(cls, prompt: str | None) -> str | None:
        if prompt is None:
            return prompt
        marker = "\x00rl_data-user-text\x00"
        try:
            formatted = prompt.format(marker)
        except (IndexError, KeyError, ValueError) as error:
            raise ValueError(
                f"prompt {prompt[:60]!r} cannot be formatted with the user text ({type(error).__name__}: "
                f"{error}); use one '{{}}' placeholder and double every other brace ('{{{{' and '}}}}')"
            ) from None
        if marker not in formatted:
            raise ValueError(
                f"prompt {prompt[:60]!r} has no '{{}}' placeholder, so the user text would be lost; "
                "add '{}' where the first user turn goes"
            )
        return prompt

    def adapter_flags(self) -> dict[str, Any]:
        """The ``ProcessorAdapter`` settings this config holds."""
        return self.model_dump(
            include={"add_bos", "add_eos", "add_generation_prompt", "control_text", "prompt", "system_prompt"}
        )


def validate_data_config(value: Any) -> DataConfig:
    """``data_config`` as a :class:`DataConfig`; every ``ValueError`` names the key and the fix."""
    if isinstance(value, DataConfig):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"data_config must be a mapping, got {type(value).__name__}: {value!r:.80}")
    if "energon" not in value:
        raise ValueError(
            "data_config has no 'energon' block; add data_config['energon'] with the Energon "
            "loader settings (an empty mapping uses the defaults)"
        )
    energon = validate_block(EnergonLoaderConfig, value["energon"], name="data_config['energon']")
    try:
        config = validate_block(DataConfig, {**value, "energon": energon}, name="data_config")
    except FileNotFoundError as error:
        raise ValueError(str(error)) from None
    get_task(energon.task).config(config.task)  # the task's own options, checked now
    return config
