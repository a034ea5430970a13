"""``LoaderSpec``: everything a loader is built from except its logical shard, typed and checked
where it is written (the driver), so a mistake fails once, there, not in every rank actor.

``processor_factory`` is an import path ``"package.module:function"`` of a zero-argument function
returning the tokenizer or processor; each rank actor calls it on its own node (nothing but this
string and the dataset path crosses machines). The checks, all before any actor starts:
``data_config`` and ``source`` (every key and value), the packing options (a known algorithm,
given together with ``data_config["energon"]["packing_buffer_size"]``, a task that packs,
``max_sequence_length`` a multiple of ``sequence_length_pad_multiple``) and the task's own options.
:func:`rl_data.energon.sft_dataloader.build_loader` builds a loader from a spec.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rl_data.config_blocks import validate_block
from rl_data.energon.config import DataConfig, EnergonSourceConfig, validate_data_config
from rl_data.import_path import load_object
from rl_data.packing.algorithms import packing_algorithm as parse_packing_algorithm
from rl_data.task_contract import Task
from rl_data.task_registry import get_task


class LoaderSpec(BaseModel):
    """The arguments of ``build_energon_sft_loader`` shared by every rank (see the module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data_config: DataConfig
    source: EnergonSourceConfig
    processor_factory: str = "rl_data.tokenization.tokenizer:load_qwen3_tokenizer"
    #: Keyword arguments of the processor factory (plain JSON, e.g. a tokenizer folder).
    processor_factory_kwargs: dict[str, Any] = Field(default_factory=dict)
    batch_size: int = Field(ge=1)
    max_sequence_length: int = Field(ge=1)
    split_role: Literal["train", "validation"] = "train"
    #: The packing algorithm (:class:`rl_data.packing.algorithms.PackingAlgorithm`, any case); None: no packing.
    packing_algorithm: Optional[str] = None
    #: Samples per pack at most (None: as many as fit); packing only.
    max_sequences_per_bin: Optional[int] = Field(default=None, ge=1)
    #: Sample lengths are padded to a multiple of this (packs and padded batches).
    sequence_length_pad_multiple: int = Field(default=1, ge=1)
    #: Train only the last message of each sample.
    only_unmask_final: bool = False

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
        module, sep, attr = self.processor_factory.partition(":")
        if not (module and sep and attr):
            raise ValueError(
                f"processor_factory={self.processor_factory!r} is not an import path; expected "
                "'package.module:function', e.g. 'rl_data.tokenization:load_qwen3_tokenizer'"
            )
        check_packing(
            self.task(), self.data_config.energon.packing_buffer_size, self.packing_algorithm,
            self.max_sequences_per_bin, self.max_sequence_length, self.sequence_length_pad_multiple,
        )  # fmt: skip
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


def check_packing(
    task: Task,
    packing_buffer_size: Optional[int],
    algorithm: Optional[str],
    max_sequences_per_bin: Optional[int],
    max_sequence_length: int,
    pad_multiple: int,
) -> None:
    """Refuse packing options that do not go together (``ValueError`` naming the fix)."""
    if packing_buffer_size is not None and algorithm is None:
        raise ValueError(
            f"packing_buffer_size is {packing_buffer_size} but packing_algorithm is None; set a packing "
            "algorithm or remove packing_buffer_size"
        )
    if algorithm is None:
        if max_sequences_per_bin is not None:
            raise ValueError(f"max_sequences_per_bin is {max_sequences_per_bin} but packing is off; set packing_algorithm or remove it")
        return
    if packing_buffer_size is None:
        raise ValueError(
            f"packing_algorithm is {algorithm!r} but packing_buffer_size is not set; set "
            "data_config['energon']['packing_buffer_size'] to pack"
        )
    if not task.supports_packing:
        raise ValueError(
            f"task {task.name!r} does not pack its samples, but packing_algorithm is {algorithm!r}; remove "
            "packing_algorithm and data_config['energon']['packing_buffer_size']"
        )
    if max_sequence_length % pad_multiple:
        raise ValueError(
            f"max_sequence_length {max_sequence_length} is not a multiple of sequence_length_pad_multiple "
            f"{pad_multiple}: a sample just below the limit would not fit a pack once padded; choose a multiple"
        )
