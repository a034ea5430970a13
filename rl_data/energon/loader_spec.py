"""``LoaderSpec``: everything a loader is built from except its logical shard, typed and checked
on the driver, so a mistake fails once, there, before any actor starts, not in every rank actor.

``processor_factory`` is an import path ``"package.module:function"`` of a zero-argument function
returning the tokenizer or processor; each rank actor calls it on its own node (nothing but this
string and the dataset path crosses machines).

Which checks run where:

* ``LoaderSpec(...)`` itself (no file is read): every key and value of ``data_config`` and
  ``source`` and the task's own options; the packing options (a known algorithm, given together
  with ``data_config["energon"]["packing_buffer_size"]``, a task that packs,
  ``max_sequence_length`` a multiple of ``sequence_length_pad_multiple``); the cooker the task
  has; and, for a task that reads an Energon dataset, how training reads it (``shuffle`` on, no
  exact passes over a mixture, a ``virtual_epoch_length`` in ``virtual`` mode).
* The entry points, on the driver, before anything starts (``start_data_coordinator``,
  ``start_prompt_feed``, ``build_energon_sft_loader``): the datasets' metadata and the
  processor factory's module (:mod:`rl_data.energon.driver_checks`).
* A rank actor checks only what it alone knows: its logical rank and world size, the placement
  fingerprint, the processor it loaded and the installed Energon version.

:func:`rl_data.energon.sft_dataloader.build_loader` builds a loader from a spec.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rl_data.config_blocks import validate_block, validator_error
from rl_data.energon.config import DataConfig, EnergonSourceConfig, validate_data_config
from rl_data.import_path import load_object
from rl_data.packing.algorithms import packing_algorithm as parse_packing_algorithm
from rl_data.task_contract import Task
from rl_data.task_registry import get_task


class LoaderSpec(BaseModel):
    """What every rank actor builds its loader from: the data, the task and its options, batch size,
    length limit and packing (everything but the rank's logical shard, which the runtime sets).

    Constructing one checks every field and how they go together; the entry points
    (``start_data_coordinator``, ``start_prompt_feed``, ``build_energon_sft_loader``) also check the
    datasets' metadata and the processor factory on the driver, before anything starts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data_config: DataConfig = Field(
        description="The loader's data_config: the Energon block, the formatting flags, the prompts and the task's options."
    )
    source: EnergonSourceConfig = Field(description="The dataset (or mixture of datasets) and the split to read.")
    processor_factory: str = Field(
        default="rl_data.tokenization.tokenizer:load_qwen3_tokenizer",
        description="Import path 'package.module:function' of a function returning the tokenizer or processor; each "
        "rank actor calls it.",
    )
    processor_factory_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments of the processor factory (plain JSON, e.g. a tokenizer folder).",
    )
    batch_size: int = Field(ge=1, description="Samples (or packs, when packing) per batch of each logical rank.")
    max_sequence_length: int = Field(ge=1, description="Longest sample in tokens; longer samples are truncated and carry no loss.")
    split_role: Literal["train", "validation"] = Field(
        default="train",
        description="'train': shuffled, endless, in for loops of virtual_epoch_length batches; 'validation': once, in order.",
    )
    packing_algorithm: Optional[str] = Field(
        default=None, description="The packing algorithm (any case, e.g. 'first_fit_decreasing'); None: no packing."
    )
    max_sequences_per_bin: Optional[int] = Field(
        default=None, ge=1, description="Samples per pack at most (None: as many as fit); packing only."
    )
    sequence_length_pad_multiple: int = Field(
        default=1, ge=1, description="Sample lengths are padded to a multiple of this (packs and padded batches)."
    )
    only_unmask_final: bool = Field(default=False, description="Train only the last message of each sample.")

    @field_validator("data_config", mode="before")
    @classmethod
    def _data_config(cls, value: Any) -> DataConfig:
        return validate_data_config(value)

    @field_validator("source", mode="before")
    @classmethod
    def _source(cls, value: Any) -> EnergonSourceConfig:
        return validate_block(EnergonSourceConfig, value, name="source")

    @field_validator("packing_algorithm")
    @classmethod
    def _algorithm(cls, value: Optional[str]) -> Optional[str]:
        return None if value is None else parse_packing_algorithm(value).value

    @model_validator(mode="after")
    def _check(self) -> "LoaderSpec":
        problems = []
        module, sep, attr = self.processor_factory.partition(":")
        if not (module and sep and attr):
            problems.append(
                f"processor_factory={self.processor_factory!r} is not an import path; expected "
                "'package.module:function', e.g. 'rl_data.tokenization.tokenizer:load_qwen3_tokenizer'"
            )
        task = self.task()
        problems += packing_problems(
            task, self.data_config.energon.packing_buffer_size, self.packing_algorithm,
            self.max_sequences_per_bin, self.max_sequence_length, self.sequence_length_pad_multiple,
        )  # fmt: skip
        if task.build_loader is None:  # an Energon loader (a task with its own loader checks its source)
            problems += energon_reading_problems(self, task)
        if problems:
            raise validator_error("LoaderSpec", problems)
        return self

    def task(self) -> Task:
        """The task ``data_config["energon"]["task"]`` names, resolved."""
        return get_task(self.data_config.energon.task)

    def load_processor_factory(self) -> Callable[[], Any]:
        """The processor factory named by ``processor_factory``, bound to its keyword arguments."""
        factory = load_object(self.processor_factory, "processor_factory")
        return functools.partial(factory, **self.processor_factory_kwargs)

    def builder_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``build_energon_sft_loader`` except processor and topology."""
        factory = {"processor_factory", "processor_factory_kwargs"}
        return {name: getattr(self, name) for name in type(self).model_fields if name not in factory}


def energon_reading_problems(spec: LoaderSpec, task: Task) -> list[str]:
    """How ``spec`` reads its Energon source, refused: a cooker ``task`` lacks; for training, shuffle
    off, exact passes over a mixture, or ``virtual`` mode without a ``virtual_epoch_length``."""
    problems = []
    cooker = spec.data_config.energon.cooker
    if cooker is not None and cooker not in task.cookers:
        problems.append(
            f"data_config['energon']['cooker'] is {cooker!r}, but task {task.name!r} has no such cooker; "
            f"set one of {sorted(task.cookers)} or remove it (the default: {task.default_cooker!r})"
        )
    if spec.split_role != "train":
        return problems
    source = spec.source
    if spec.data_config.shuffle is not True:
        problems.append(
            f"data_config['shuffle'] is {spec.data_config.shuffle!r}, expected True: a train loader always "
            "shuffles; set data_config['shuffle'] = True (or read the split with split_role 'validation')"
        )
    if source.is_mixture and source.epoch_mode == "exact":
        # Energon refuses one pass over a weighted blend; over an epochized blend it runs, but a
        # state saved near the pass end does not restore exactly (checked): refused for both
        problems.append(
            f"train source {source.describe()!r} has epoch_mode 'exact', but a mixture samples its members by "
            "weight and repeats each one forever, so it has no exact passes; set source epoch_mode 'virtual' "
            "and a virtual_epoch_length (batches per for loop)"
        )
    elif source.epoch_mode == "virtual" and source.virtual_epoch_length <= 0:
        problems.append(
            f"train source {source.describe()!r} has epoch_mode 'virtual' and virtual_epoch_length "
            f"{source.virtual_epoch_length}, expected a length > 0: virtual mode repeats the data forever, so a for "
            "loop needs a length in batches; set virtual_epoch_length, or use epoch_mode 'exact' (0: one pass per "
            "for loop)"
        )
    return problems


def packing_problems(
    task: Task,
    packing_buffer_size: Optional[int],
    algorithm: Optional[str],
    max_sequences_per_bin: Optional[int],
    max_sequence_length: int,
    pad_multiple: int,
) -> list[str]:
    """Packing options that do not go together, each naming the fix ([]: they do)."""
    if packing_buffer_size is not None and algorithm is None:
        return [
            f"packing_buffer_size is {packing_buffer_size} but packing_algorithm is None; set a packing "
            "algorithm or remove packing_buffer_size"
        ]
    if algorithm is None:
        if max_sequences_per_bin is not None:
            return [f"max_sequences_per_bin is {max_sequences_per_bin} but packing is off; set packing_algorithm or remove it"]
        return []
    if packing_buffer_size is None:
        return [
            f"packing_algorithm is {algorithm!r} but packing_buffer_size is not set; set "
            "data_config['energon']['packing_buffer_size'] to pack"
        ]
    problems = []
    if not task.supports_packing:
        problems.append(
            f"task {task.name!r} does not pack its samples, but packing_algorithm is {algorithm!r}; remove "
            "packing_algorithm and data_config['energon']['packing_buffer_size']"
        )
    if max_sequence_length % pad_multiple:
        problems.append(
            f"max_sequence_length {max_sequence_length} is not a multiple of sequence_length_pad_multiple "
            f"{pad_multiple}: a sample just below the limit would not fit a pack once padded; choose a multiple"
        )
    return problems
