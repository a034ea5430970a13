"""``Task``: one kind of training sample, from the stored JSON to batches, described in one place.

A task owns:

- its **stored-sample schema** (:class:`SampleSchema`): the ``kind`` written in every sample's
  JSON, the fields that hold message lists (media are referenced in their order), the checks
  preprocess runs on an adapted row (raising ``RowRejected`` with a reason code) and the
  conversations whose token length preprocess measures. Tasks may share a schema (text and
  VLM SFT both store ``"sft"`` samples);
- its **cookers** (crude WebDataset sample -> typed sample, ``@stateless``) and its Energon
  **task encoder** class;
- a typed, frozen **encoder config** (:class:`TaskConfig` subclass, ``extra="forbid"``) for
  the options only this task has; it is validated on the driver from
  ``data_config["task"]`` and recorded whole in the loader identity (``task.config``);
- :meth:`Task.batch_stats`, which the rank actors' metrics call instead of reading columns,
  and :meth:`Task.merge_spec`, how batches of several logical shards merge into one DP rank's;
- optionally the **demo data** the main job prepares for it (:class:`DemoData`).

- the **preprocess adapters** it defines (:class:`AdapterSpec`: a function from a raw row to a
  stored sample, and the row keys that identify that schema), declared here, never registered
  as a side effect of importing the task's module.

This module is the contract, at the bottom of the layers: it imports nothing of rl_data but pure
helpers. Tasks are registered and looked up by name (or stored kind) in
:mod:`rl_data.task_registry`; the upper layers (preprocess, the runtime, the jobs) resolve names
there and hand the resolved :class:`Task` to the layers below (the Energon loader).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from rl_data.batch_stats import batch_stats
from rl_data.config_blocks import validate_block
from rl_data.merge_spec import MergeSpec

#: The project tokenizer (``LoaderSpec.processor_factory`` of text tasks).
TOKENIZER_FACTORY = "rl_data.tokenization.tokenizer:load_qwen3_tokenizer"


class TaskConfig(BaseModel):
    """Base of every task's encoder config: frozen, unknown keys refused, plain JSON."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class SampleSchema:
    """One stored sample kind (see :mod:`rl_data.energon.sample_format`)."""

    #: Value of ``sample["kind"]``.
    kind: str
    #: Sample fields holding message lists, in the order their media are referenced.
    message_lists: tuple[str, ...]
    #: ``validate(sample, media)`` raises ``RowRejected`` for the first problem of an adapted
    #: row; ``media`` allows image/video/audio content parts.
    validate: Callable[[Mapping[str, Any], bool], None]
    #: The conversations preprocess formats to measure a sample (the longest is its length).
    conversations: Callable[[Mapping[str, Any]], list[list[dict[str, Any]]]]
    #: Quarantine reason codes this schema adds (code -> meaning).
    reasons: Mapping[str, str] = field(default_factory=dict)


Adapter = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class AdapterSpec:
    """A preprocess adapter and the key sets that identify its schema (any one set suffices)."""

    name: str
    fn: Adapter
    detect_keys: tuple[frozenset[str], ...]
    #: Detected only when a task restricts detection to its adapters (``--task``).
    task_only: bool = False

    @classmethod
    def of(cls, fn: Adapter, *detect_keys: Any, name: str | None = None, task_only: bool = False) -> "AdapterSpec":
        """``fn`` as adapter ``name`` (default: its function name), detected by any of ``detect_keys``."""
        return cls(name or fn.__name__, fn, tuple(frozenset(keys) for keys in detect_keys), task_only)


@dataclass(frozen=True)
class DemoData:
    """The raw data the main job writes and preprocesses for a task."""

    description: str
    #: ``(path, n)`` -> writes up to ``n`` raw rows as JSONL to ``path``; returns rows written.
    write_raw_rows: Callable[[Path, int], int]
    #: Preprocess adapter that reads those rows.
    adapter: str
    #: ``LoaderSpec.processor_factory``: the tokenizer, or a multimodal processor.
    processor_factory: str = TOKENIZER_FACTORY


@dataclass(frozen=True)
class Task:
    """One registered task (see the module docstring)."""

    #: Registry name; ``data_config["energon"]["task"]`` selects it.
    name: str
    schema: SampleSchema
    #: The Energon task encoder class; built by :meth:`build_encoder` (None: a task with its own
    #: ``build_loader``, which reads no Energon dataset).
    encoder_class: type | None
    #: Cookers by name (the first is the default); ``data_config["energon"]["cooker"]`` may
    #: pick another. The encoder gets the cooker class as ``cooker=``.
    cookers: Mapping[str, type]
    #: The task's own encoder options (recorded whole in the loader identity).
    config_class: type[TaskConfig] = TaskConfig
    #: ``batch -> BatchStats`` for the rank metrics.
    stats: Callable[[Any], Any] | None = None
    supports_packing: bool = True
    #: ``ProcessorAdapter`` flags this task fixes whatever ``data_config`` says (e.g. an RL
    #: prompt is always rendered with the generation prompt and without EOS).
    adapter_overrides: Mapping[str, Any] = field(default_factory=dict)
    #: Preprocess adapters that write this task's samples (built-in ones by name, and those in
    #: ``adapter_specs``); ``--task`` restricts schema detection to them.
    adapters: tuple[str, ...] = ()
    #: Preprocess adapters this task defines (known to preprocess once the task is registered).
    adapter_specs: tuple[AdapterSpec, ...] = ()
    #: The encoder needs the whole processor (media), not only its tokenizer.
    needs_processor: bool = False
    #: ``config -> columns padded on the left`` (default: every padded column pads on the right).
    left_padded_columns: Callable[[Any], tuple[str, ...]] | None = None
    demo: DemoData | None = None
    #: Its batches are prompt rows keyed by ``source_ids``: a prompt feed may serve them.
    prompt_batches: bool = False
    #: Builds this task's loader instead of the Energon one (a task that reads no Energon dataset,
    #: e.g. :mod:`rl_data.tasks.synthetic`); the signature of
    #: :func:`rl_data.energon.sft_dataloader.build_loader`. See ``rl_data.distributed.rank_actor.loader_builder``.
    build_loader: Callable[..., Any] | None = None

    @property
    def default_cooker(self) -> str:
        """Name of the cooker used when none is configured."""
        return next(iter(self.cookers))

    def config(self, value: Any) -> TaskConfig:
        """Validate ``data_config["task"]`` (a mapping, None or a config) as this task's config."""
        return validate_block(self.config_class, {} if value is None else value, name=f"data_config['task'] (options of task {self.name!r})")

    def cooker(self, name: str | None) -> type:
        """The cooker class named ``name`` (None: the default)."""
        name = name or self.default_cooker
        if name not in self.cookers:
            raise ValueError(f"task {self.name!r} has no cooker {name!r}; its cookers are {sorted(self.cookers)}")
        return self.cookers[name]

    def build_encoder(self, *, config: TaskConfig, processor: Any, cooker: str | None = None, **options: Any) -> Any:
        """The task encoder: the common encoder ``options`` plus this task's ``config``.

        The processor is passed only to encoders that need it; an encoder that does not pack
        refuses packing options itself.
        """
        if self.encoder_class is None:
            raise ValueError(
                f"task {self.name!r} has no Energon task encoder: it builds its own loader (Task.build_loader); "
                "build its loader with rl_data.distributed.rank_actor.loader_builder(spec)"
            )
        extra = {"processor": processor} if self.needs_processor else {}
        fields = {name: getattr(config, name) for name in type(config).model_fields}
        return self.encoder_class(**extra, **fields, cooker=self.cooker(cooker), **options)

    def merge_spec(self, config: TaskConfig, pad_token_id: int) -> MergeSpec:
        """How this task's batches of several shards merge (``MergeSpec``): ``input_ids`` pad
        with the tokenizer's pad id, other padded columns with 0."""
        left = self.left_padded_columns(config) if self.left_padded_columns is not None else ()
        return MergeSpec(pad_values={"input_ids": int(pad_token_id)}, left_padded=tuple(left))

    def batch_stats(self, batch: Any) -> Any:
        """Samples, real tokens and zero-loss samples of one batch (``BatchStats``)."""
        if self.stats is not None:
            return self.stats(batch)
        return batch_stats(batch)
