"""Energon SFT loader for one logical data shard, with a checked, restorable state.

:func:`build_energon_sft_loader` builds one Energon savable loader for an explicit logical
rank of a logical world size and one split, wrapped in :class:`EnergonSFTDataLoader`, whose
``state_dict`` is the format-2 envelope: the Energon rank state as a uint8 tensor of data that
loads without running code (:mod:`rl_data.energon.state_codec`), the loader identity that a
restore must match and, for training, the position of the rank's stream (:class:`rl_data.energon.epoch_stream.StreamPosition`). Training reads one
endless stream per rank (:mod:`rl_data.energon.epoch_stream`) in exact passes or in Energon's
repeating mode (``epoch_mode``), cut into ``for`` loops. Bad samples are logged in one line by
:func:`compact_sample_error_handler` and skipped; the failure budget turns a systematic failure
into one :class:`SampleFailureBudgetExceeded`.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, Protocol

import torch
from pydantic import ValidationError
from megatron.energon import WorkerConfig, get_train_dataset, get_val_dataset
from megatron.energon.errors import FatalSampleError

from rl_data.batched_data_dict import BatchedDataDict
from rl_data.energon import compat
from rl_data.energon.config import (
    EnergonLoaderConfig,
    EnergonSourceConfig,
    validate_block,
    validate_data_config,
)
from rl_data.energon.epoch_stream import PassEndDataset, PassOver, RankStream, StreamPosition
from rl_data.energon.failure_budget import (
    SampleFailureBudgetExceeded,
    SkipCountingWorkerConfig,
    compact_sample_error_handler,
    empty_pass_error,
)
from rl_data.energon.mixture import (
    MixtureRecord,
    member_names_by_path,
    mixture_members,
    weights_of,
)
from rl_data.energon.identity import (
    LOADER_STATE_FORMAT,
    _V2_STATE_FORMAT_VERSION,
    _loader_identity,
    _v2_topology,
    check_restorable,
)
from rl_data.energon.state_codec import EncodedValueCache, decode_rank_state, encode_rank_state
from rl_data.energon.task_encoders import ProcessorAdapter
from rl_data.fingerprint import brief, differences, fingerprint
from rl_data.stateful import envelope
from rl_data.config_blocks import ConfigError, problems_of
from rl_data.energon.driver_checks import source_problems
from rl_data.energon.loader_spec import LoaderSpec
from rl_data.task_contract import Task
from rl_data.task_registry import get_task
from rl_data.tokenization.chat import formatting_path
from rl_data.tokenization.fast_encode import text_encoder

_SPLIT_ROLES = ("train", "validation")
#: Extra worker checkpoints kept beyond Energon's default, for items a stream holds back.
_EXTRA_WORKER_CHECKPOINTS = 8

__all__ = ["EnergonSFTDataLoader", "SFTDataLoader", "build_energon_sft_loader"]


class SFTDataLoader(Protocol):
    """Iterator and state methods consumed by the SFT algorithm."""

    def __iter__(self) -> Iterator[BatchedDataDict[Any]]: ...

    def __len__(self) -> int: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class EnergonSFTDataLoader:
    """Expose Energon rank state through NeMo-RL's dataloader interface.

    ``state_dict()`` never blocks: Energon hangs when the state is saved after ``iter()`` but
    before the first batch with worker processes, so until the first batch the state taken at
    construction (or restored) is returned, which is the same position. ``skipped_samples``
    counts the bad samples skipped since this loader was built (in all its workers).

    A training loader (``loop_length`` not None) reads the rank's endless stream; each ``for``
    loop yields ``loop_length`` batches of it, or, with ``loop_length=0`` (exact mode), one
    pass. ``dropped_samples`` counts the samples that exact passes left in partial batches.
    """

    #: The reference format 2 (``backend`` names it: :mod:`rl_data.stateful`).
    STATE_FORMAT, STATE_VERSION = LOADER_STATE_FORMAT, _V2_STATE_FORMAT_VERSION

    def __init__(
        self,
        loader: Any,
        *,
        identity: Mapping[str, Any],
        loop_length: int | None = None,
        mixture: MixtureRecord | None = None,
    ) -> None:
        self._loader = loader
        self._mixture = mixture
        self._loop_length = loop_length
        self._stream = RankStream(loader) if loop_length is not None else None
        self._dropped = 0
        self._identity = copy.deepcopy(dict(identity))
        self._fingerprint = fingerprint(self._identity)
        self._resting_state: Any = None  # the state before the first batch
        self._iterated = False
        self._restored = False
        self._closed = False
        self._energon_iterating = False
        self._batches = 0
        self._delivered = 0
        worker_config = getattr(loader, "worker_config", None)
        self._budget = (
            worker_config if isinstance(worker_config, SkipCountingWorkerConfig) else None
        )

    @property
    def identity(self) -> dict[str, Any]:
        """What a restored state must agree with (plain JSON)."""
        return copy.deepcopy(self._identity)

    @property
    def skipped_samples(self) -> int:
        """Bad samples skipped since this loader was built."""
        return self._budget.skipped_count() if self._budget is not None else 0

    @property
    def filtered_samples(self) -> int:
        """Samples the task encoder filtered out on purpose (e.g. RL prompts over
        ``max_sequence_length``) since this loader was built, in all its workers."""
        return self._budget.filtered_count() if self._budget is not None else 0

    @property
    def mixture(self) -> dict[str, Any] | None:
        """For a mixture source: batches and samples per member delivered since the start of the
        run (restores included), and the weights in force from which batch on; else None."""
        return self._mixture.to_json() if self._mixture is not None else None

    @property
    def dropped_samples(self) -> int:
        """Samples that passes ended since this loader was built left out of every batch."""
        return self._dropped

    @property
    def completed_passes(self) -> int | None:
        """Exact passes the rank's training stream completed (restored ones included)."""
        return self._stream.position.passes if self._stream is not None else None

    def __len__(self) -> int:
        """Batches per ``for`` loop (approximate for a whole pass: Energon's estimate)."""
        if self._loop_length:
            return self._loop_length
        return len(self._loader)

    def __iter__(self) -> Iterator[BatchedDataDict[Any]]:
        self._require_open()
        self._iterated = True
        return self._iterate() if self._stream is None else self._iterate_stream()

    def close(self) -> None:
        """Stop the worker processes now; the loader cannot be used afterwards.

        Dropping the last reference to the loader does the same; a loader kept alive in a
        reference cycle would stop its workers only when the garbage collector frees it, 5 s
        per worker (torch joins them with a timeout after the queues were finalized).
        """
        self._closed = True
        if self._stream is not None:
            self._stream.close()
        self._loader.close()

    def __del__(self, _is_finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        # A loader dropped without close(): its workers stop now, while their queues are alive
        # (Energon's loader sits in a reference cycle: torch's clean-up at a later garbage
        # collection finds the queues finalized and waits 5 s per worker). At interpreter exit the
        # modules close() calls may be torn down already (their globals None, this module's too:
        # hence the default argument); the end of the process stops the workers.
        if getattr(self, "_closed", True):
            return
        try:
            self.close()
        except Exception:
            if not _is_finalizing():
                raise

    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Energon loader was closed; build a new one")

    def _iterate(self) -> Iterator[BatchedDataDict[Any]]:
        skipped_before, batches = self.skipped_samples, 0
        self._energon_iterating = True
        try:
            for batch in self._loader:
                batches += 1
                self._batches += 1
                self._delivered += _count_sources(batch)
                self._count_members(batch)
                if self._budget is not None:
                    self._budget.check_ratio(self._delivered, self._source_name())
                yield batch
        except FatalSampleError as error:
            raise self._fatal(error) from error
        newly_skipped = self.skipped_samples - skipped_before
        if batches == 0 and newly_skipped > 0:
            raise SampleFailureBudgetExceeded(
                f"{self._source_name()}: a whole pass yielded no batch and skipped "
                f"{newly_skipped} sample(s); every sample failed, so the data or the task "
                "encoder is systematically broken (see the 'skipped sample' log lines)"
            )

    def _iterate_stream(self) -> Iterator[BatchedDataDict[Any]]:
        stream, length = self._stream, self._loop_length
        position = stream.position
        if length and position.loop_batches >= length:
            position.loop_batches = 0  # restored right after a full loop
        yielded, skipped_before = 0, self.skipped_samples
        try:
            while not (length and position.loop_batches >= length):
                item = stream.next()
                if isinstance(item, PassOver):
                    self._dropped += item.dropped
                    if item.batches == 0:
                        raise empty_pass_error(
                            self._source_name(), dropped=item.dropped, skipped=self.skipped_samples - skipped_before,
                            filtered=self.filtered_samples, batch_size=self._identity.get("batch_size"),
                        )  # fmt: skip
                    if not length and yielded:
                        return
                    continue  # loop_length 0: a pass that ended before this loop's first batch
                yielded += 1
                if length:
                    position.loop_batches += 1
                self._batches += 1
                self._delivered += _count_sources(item)
                self._count_members(item)
                if self._budget is not None:
                    self._budget.check_ratio(self._delivered, self._source_name())
                yield item
            position.loop_batches = 0
        except FatalSampleError as error:
            raise self._fatal(error) from error

    def _count_members(self, batch: Any) -> None:
        if self._mixture is not None:
            self._mixture.count(batch.get("source_datasets"))

    def _fatal(self, error: FatalSampleError) -> SampleFailureBudgetExceeded:
        return SampleFailureBudgetExceeded(
            f"{self._source_name()}: a pipeline stage failed "
            f"{self._budget.max_consecutive_failures if self._budget else 'too many'} "
            "times in a row, so the data or the task encoder is systematically broken; "
            "see the 'skipped sample' log lines for the failing samples (Energon: "
            f"{str(error).splitlines()[0][:300]})"
        )

    def _source_name(self) -> str:
        source = self._identity.get("source", {})
        where = source.get("path") if self._mixture is None else "mixture of " + ", ".join(self._mixture.counts)
        return f"Energon source {where!r} (split {source.get('split')!r})"

    def state_dict(self) -> dict[str, Any]:
        """The format-2 envelope; loads with ``torch.load(weights_only=True)``."""
        rank_state, position, encoded = self._rank_state()
        return self._envelope(encode_rank_state(rank_state, encoded), position, self._mixture_json())

    def state_dict_deferring(self) -> tuple[dict[str, Any], Callable[[], dict[str, Any]] | None]:
        """:meth:`state_dict` without what only makes a restore faster, and how to add it later.

        Packed, a state holds the packing buffers' encoded samples (~0.5 MB; their compaction and
        encoding are most of a packed ``state_dict``'s ~25 ms). The state returned here leaves them
        out: it is as exact, only a restore from it encodes those samples again. The callable
        (None when nothing was left out) returns the complete state of the same moment, equal to
        what :meth:`state_dict` returned now. It may run in another thread while this loader
        iterates: it reads only that moment's snapshot and samples that are never changed.
        """
        rank_state, position, encoded = self._rank_state()
        left_out: list[Any] = []
        mixture = self._mixture_json()
        light = self._envelope(encode_rank_state(rank_state, encoded, left_out=left_out), position, mixture)
        if not left_out:
            return light, None
        position, mixture = copy.deepcopy(position), copy.deepcopy(mixture)
        return light, lambda: self._envelope(encode_rank_state(rank_state), position, mixture)

    def _rank_state(self) -> tuple[Any, dict[str, Any] | None, EncodedValueCache | None]:
        """The Energon rank state now, the stream position and the worker-state JSON cache."""
        self._require_open()
        if self._stream is not None:
            return self._stream.energon_state(), self._stream.position.to_json(), self._stream.encoded_worker_states
        if self._energon_iterating and self._batches == 0:
            return self._resting_state, None, None
        return self._loader.save_state_rank(), None, None

    def _mixture_json(self) -> dict[str, Any] | None:
        return self._mixture.to_json() if self._mixture is not None else None

    def _envelope(self, payload: bytes, position: dict[str, Any] | None, mixture: dict[str, Any] | None) -> dict[str, Any]:
        fields = {
            "fingerprint": self._fingerprint,
            "identity": copy.deepcopy(self._identity),
            "loader_state": torch.frombuffer(bytearray(payload), dtype=torch.uint8).clone(),
            "position": position,
            **({"mixture": mixture} if mixture is not None else {}),
        }
        return envelope(self.STATE_FORMAT, self.STATE_VERSION, fields, format_key="backend")

    def load_state_dict(self, state: dict[str, Any], *, reweight: bool = False) -> None:
        """Restore a state saved by a loader with the same identity, once, before iterating.

        ``reweight``: a mixture whose member weights changed (and nothing else) continues with
        the new weights from each member's restored position, and the state's weight history
        records the change; without it such a state is refused like any other change.

        A second restore is refused (the loader is left as the first one left it): Energon
        cannot take a restored loader back to its start (an initial state restores nothing), so
        it would go on after the first state. Build a fresh loader for each restore.
        """
        if self._iterated or self._restored:
            done = "already started iterating" if self._iterated else "was restored already"
            raise RuntimeError(
                f"cannot restore an Energon loader that {done}; build a fresh loader with the "
                "same arguments and call load_state_dict once, before iter()"
            )
        if not isinstance(state, Mapping):
            raise ValueError(f"loader state must be a mapping, got {type(state).__name__}")
        if state.get("backend") != self.STATE_FORMAT:
            raise ValueError(
                f"loader state backend is {state.get('backend')!r}, expected {self.STATE_FORMAT!r}; "
                "this state was saved by another dataloader backend"
            )
        if state.get("format_version") != self.STATE_VERSION:
            raise ValueError(
                f"loader state format_version is {state.get('format_version')!r}, this loader "
                f"reads only format {self.STATE_VERSION}"
            )
        reweighted = check_restorable(
            state.get("identity"), self._identity, reweight=reweight, saved_fingerprint=state.get("fingerprint", "")
        )
        mixture = self._saved_mixture(state.get("mixture"), reweighted)
        payload = state.get("loader_state")
        if not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8:
            found = payload.dtype if isinstance(payload, torch.Tensor) else type(payload).__name__
            raise ValueError(
                f"loader_state must be a uint8 tensor of the encoded Energon rank state, got {found}"
            )
        position = self._saved_position(state.get("position"))
        rank_state = decode_rank_state(payload.contiguous().numpy().tobytes())
        self._restored = True  # from here on Energon changes: even a restore that fails halfway counts
        if self._stream is not None:
            self._stream.restore(rank_state, position)
        else:
            self._loader.restore_state_rank(rank_state)
            self._resting_state = rank_state
        self._mixture = mixture

    def _saved_mixture(self, value: Any, reweighted: list[str]) -> MixtureRecord | None:
        """The restored mixture record, with the new weights in its history when they changed."""
        if self._mixture is None:
            return None
        record = MixtureRecord.from_json(value) if value is not None else self._mixture
        if reweighted:
            record = record.reweighted(weights_of(self._identity["mixture"]))
        return record

    def _saved_position(self, value: Any) -> StreamPosition | None:
        if self._stream is None:
            if value is not None:
                raise ValueError(f"a validation loader state has no position, got {value!r}")
            return None
        return StreamPosition.from_json(value, workers=max(1, self._loader.num_workers))


def _count_sources(batch: Any) -> int:
    """Samples in a batch: one per source id (several per pack) or one per row."""
    source_ids = batch.get("source_ids") if isinstance(batch, (Mapping, BatchedDataDict)) else None
    if source_ids is None:
        return int(batch.size) if isinstance(batch, BatchedDataDict) else 1
    return sum(len(ids) if isinstance(ids, (list, tuple)) else 1 for ids in source_ids)


# The reference API's private helpers (NeMo-RL's ``sft_dataloader`` page lists them); the
# implementations are public in :mod:`rl_data.fingerprint` and the config models.


def _identity_fingerprint(identity: Mapping[str, Any]) -> str:
    """:func:`rl_data.fingerprint.fingerprint` of a loader identity."""
    return fingerprint(identity)


def _brief(value: Any) -> str:
    """:func:`rl_data.fingerprint.brief`."""
    return brief(value)


def _identity_differences(saved: Any, current: Any, path: str = "") -> list[str]:
    """List the identity entries that changed, as ``key old -> new`` lines (:func:`rl_data.fingerprint.differences`)."""
    return differences(saved, current, path)


def _source_config(value: Any, *, name: str) -> EnergonSourceConfig:
    return validate_block(EnergonSourceConfig, value, name=name)


def _loader_config(value: Any) -> EnergonLoaderConfig:
    return validate_block(EnergonLoaderConfig, value, name="data_config['energon']")


def _worker_config(
    config: EnergonLoaderConfig, *, logical_rank: int, logical_world_size: int
) -> WorkerConfig:
    if not isinstance(logical_world_size, int) or logical_world_size <= 0:
        raise ValueError(f"logical_world_size must be an integer >= 1, got {logical_world_size!r}")
    if not isinstance(logical_rank, int) or not 0 <= logical_rank < logical_world_size:
        raise ValueError(
            f"logical_rank must be in [0, {logical_world_size}) for logical_world_size "
            f"{logical_world_size}, got {logical_rank!r}"
        )
    return SkipCountingWorkerConfig.create(
        rank=logical_rank,
        world_size=logical_world_size,
        num_workers=config.num_workers,
        seed_offset=config.seed_offset,
        global_error_handler=compact_sample_error_handler,
        restore_error_handler=compact_sample_error_handler,
        max_consecutive_failures=config.max_consecutive_failures,
        max_failure_ratio=config.max_failure_ratio,
        failure_ratio_min_samples=config.failure_ratio_min_samples,
    )


def _task_encoder(spec: LoaderSpec, task: Task, adapter: Any, processor: Any, members: Any) -> Any:
    """The task encoder of ``task`` with the spec's options (``data_config["batch_format"]`` None:
    padded tensors for the tasks whose encoder can make them, else message logs)."""
    loader_config, batch_format = spec.data_config.energon, spec.data_config.batch_format
    if batch_format is None:
        batch_format = "tensors" if getattr(task.encoder_class, "TENSOR_BATCHES", False) else "message_log"
    return task.build_encoder(
        config=task.config(spec.data_config.task),
        processor=processor,
        cooker=loader_config.cooker,
        adapter=adapter,
        include_source_ids=True,
        packing_algorithm=spec.packing_algorithm,
        max_sequences_per_bin=spec.max_sequences_per_bin,
        max_sequence_length=spec.max_sequence_length,
        sequence_length_pad_multiple=spec.sequence_length_pad_multiple,
        tokenizer=adapter.tokenizer,
        only_unmask_final=spec.only_unmask_final,
        packing_seed=loader_config.seed_offset,
        failure_tolerance=loader_config.max_consecutive_failures,
        source_datasets=member_names_by_path(members),
        batch_format=batch_format,
    )


def _batch_as_is(batch: Any) -> Any:
    """The torch ``DataLoader`` collate for Energon's finished batches.

    With ``batch_size=None`` torch applies ``default_convert``, which rebuilds every dict and
    list of a batch recursively (each message of every message log): ~10 % of an unpacked
    rank's time, for a batch the task encoder already made of tensors.
    """
    return batch


def build_energon_sft_loader(
    *,
    data_config: Mapping[str, Any],
    source: Mapping[str, Any] | EnergonSourceConfig,
    processor: Any,
    batch_size: int,
    max_sequence_length: int,
    split_role: Literal["train", "validation"],
    logical_rank: int,
    logical_world_size: int,
    placement_fingerprint: str,
    packing_algorithm: str | None,
    max_sequences_per_bin: int | None,
    sequence_length_pad_multiple: int,
    only_unmask_final: bool,
) -> EnergonSFTDataLoader:
    """Build one loader for an explicit logical data shard and split (:func:`build_loader` of
    the :class:`~rl_data.energon.loader_spec.LoaderSpec` these arguments make).

    ``data_config`` is a :class:`~rl_data.energon.config.DataConfig` (or its mapping):
    ``data_config["energon"]`` is the :class:`EnergonLoaderConfig` block, whose ``task`` names
    the task (:mod:`rl_data.tasks`) and ``data_config["task"]`` its options; ``add_bos``,
    ``add_eos``, ``add_generation_prompt``, ``control_text`` and the ``TaskDataSpec`` prompts
    (``prompt``, ``system_prompt``) set the formatting. Training reads ``source.split``
    shuffled, forever: in exact passes (``source.epoch_mode="exact"``, each worker dropping and
    counting its last partial batch) or Energon's repeating stream (``"virtual"``); each ``for``
    loop is ``source.virtual_epoch_length`` batches, or one pass when that is 0. Validation reads
    it once in order, keeps the last partial batch and stops after ``source.limit`` batches.

    The caller is the driver here: what the spec refuses and what the datasets' metadata show
    (:mod:`rl_data.energon.driver_checks`) is raised as one :class:`~rl_data.config_blocks.ConfigError`
    before anything is built.
    """
    data_config = validate_data_config(data_config)
    if processor is None:
        raise ValueError(
            "processor is None; a tokenizer or a processor (with .tokenizer) is required"
        )
    if not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if split_role not in _SPLIT_ROLES:
        raise ValueError(f"split_role must be one of {_SPLIT_ROLES}, got {split_role!r}")
    source = _source_config(source, name=f"{split_role} source")
    problems = source_problems(source) if get_task(data_config.energon.task).build_loader is None else []
    try:
        spec = LoaderSpec(
            data_config=data_config, source=source, batch_size=batch_size, max_sequence_length=max_sequence_length,
            split_role=split_role, packing_algorithm=packing_algorithm, max_sequences_per_bin=max_sequences_per_bin,
            sequence_length_pad_multiple=sequence_length_pad_multiple, only_unmask_final=only_unmask_final,
        )  # fmt: skip
    except ValidationError as error:
        problems = problems_of(error) + problems
    if problems:
        raise ConfigError(f"the {split_role} loader of {source.describe()!r} was not built", problems)
    return build_loader(
        spec, processor, logical_rank=logical_rank, logical_world_size=logical_world_size,
        placement_fingerprint=placement_fingerprint,
    )  # fmt: skip


def build_loader(
    spec: LoaderSpec,
    processor: Any,
    *,
    logical_rank: int,
    logical_world_size: int,
    placement_fingerprint: str,
    task: Task | None = None,
) -> EnergonSFTDataLoader:
    """Build the loader ``spec`` describes for one logical data shard: the Energon dataset with the
    task encoder (:func:`_energon_dataset`), the savable loader over it (:func:`_savable_loader`)
    and its identity (:func:`_identity`).

    ``processor``: the tokenizer or processor (``spec.load_processor_factory()()``); ``task``: the
    task the spec names, when the caller resolved it already (the rank actors do). The spec was
    checked where it was written (the driver); only what a rank alone knows is checked here: its
    logical rank and world size, the placement fingerprint, the processor and the Energon version.
    """
    if processor is None:
        raise ValueError(
            "processor is None; a tokenizer or a processor (with .tokenizer) is required"
        )
    if not placement_fingerprint:
        raise ValueError(
            "placement_fingerprint is empty; pass the fingerprint of the logical placement so "
            "a state saved under another placement is refused"
        )
    if task is None:
        task = spec.task()
    elif task is not spec.task():
        raise ValueError(f"build_loader was given task {task.name!r} for a spec of task {spec.data_config.energon.task!r}")
    adapter = ProcessorAdapter.from_processor(
        processor, {**spec.data_config.adapter_flags(), **task.adapter_overrides}, spec.max_sequence_length
    )
    # Built and decided here, once: worker processes forked later inherit both (each built its own:
    # ~0.3 + 0.08 CPU-s per worker start), and a restore's first batch does not pay them.
    text_encoder(adapter.tokenizer)
    if getattr(adapter.tokenizer, "chat_template", None) is not None:  # no probe warning without one
        formatting_path(adapter.tokenizer)
    compat.install()  # checks the Energon version, before anything of Energon is built
    worker_config = _worker_config(
        spec.data_config.energon, logical_rank=logical_rank, logical_world_size=logical_world_size
    )
    members = mixture_members(spec.source)
    task_encoder = _task_encoder(spec, task, adapter, processor, members)
    loader = _savable_loader(_energon_dataset(spec, task_encoder, worker_config), spec.data_config.energon)
    topology = _v2_topology(
        loader_config=spec.data_config.energon, placement_fingerprint=placement_fingerprint,
        logical_rank=logical_rank, logical_world_size=logical_world_size,
    )  # fmt: skip
    identity = _identity(spec, task, adapter, task_encoder, members, topology)
    weights = weights_of(members) if members is not None else {}
    record = MixtureRecord.start(weights) if weights else None
    loop_length = spec.source.virtual_epoch_length if spec.split_role == "train" else None
    return EnergonSFTDataLoader(loader, identity=identity, loop_length=loop_length, mixture=record)


def _energon_dataset(spec: LoaderSpec, task_encoder: Any, worker_config: WorkerConfig) -> Any:
    """The Energon dataset of ``spec``'s split with ``task_encoder``: endless for training
    (:func:`_train_dataset`), once and in order for validation (keeping the last partial batch)."""
    source, loader_config = spec.source, spec.data_config.energon
    common = dict(
        split_part=source.split,
        worker_config=worker_config,
        batch_size=spec.batch_size,
        packing_buffer_size=loader_config.packing_buffer_size,
        task_encoder=task_encoder,
    )
    if spec.split_role == "train":
        return _train_dataset(source, loader_config, worker_config, common)
    return get_val_dataset(source.energon_source(), batch_drop_last=False, limit=source.limit, **common)


def _savable_loader(dataset: Any, loader_config: EnergonLoaderConfig) -> Any:
    """Energon's savable loader over ``dataset``: its internal checkpoints, prefetching and watchdog,
    batches passed through as they are, pinned only with CUDA."""
    workers = max(1, loader_config.num_workers)
    loader = compat.SavableLoader(
        dataset,
        checkpoint_every_sec=loader_config.checkpoint_every_sec,
        checkpoint_every_min_n_samples=1,  # the period alone decides (Energon: 2 x workers batches)
        n_checkpoints=loader_config.prefetch_factor * workers + 1 + _EXTRA_WORKER_CHECKPOINTS,
        prefetch_factor=loader_config.prefetch_factor,
        watchdog_timeout_seconds=loader_config.watchdog_timeout_seconds,
    )
    loader.collate_fn = _batch_as_is
    # Energon always asks torch to pin batches; without CUDA that only warns on every iter().
    loader.pin_memory = torch.cuda.is_available()
    return loader


def _identity(
    spec: LoaderSpec, task: Task, adapter: Any, task_encoder: Any, members: Any, topology: dict[str, Any]
) -> dict[str, Any]:
    """The loader identity (:func:`_loader_identity`) plus the task encoder's component versions and
    the task with its options."""
    train = spec.split_role == "train"
    identity = _loader_identity(
        source=spec.source,
        loader_config=spec.data_config.energon,
        adapter=adapter.identity_summary,
        split_role=spec.split_role,
        batch_size=spec.batch_size,
        shuffle=True if train else None,  # a train loader always shuffles (LoaderSpec refuses one that does not)
        topology=topology,
        packing_algorithm=spec.packing_algorithm,
        max_sequences_per_bin=spec.max_sequences_per_bin,
        sequence_length_pad_multiple=spec.sequence_length_pad_multiple,
        only_unmask_final=spec.only_unmask_final,
        mixture=members,
    )
    identity["components"] = task_encoder.component_versions
    identity["task"] = {"name": task.name, "config": task.config(spec.data_config.task).model_dump(mode="json")}
    return identity


def _train_dataset(
    source: EnergonSourceConfig,
    loader_config: EnergonLoaderConfig,
    worker_config: WorkerConfig,
    common: Mapping[str, Any],
) -> Any:
    """The endless Energon train dataset: exact passes, or Energon's own repetition.

    Energon's virtual epochs are not used: the ``for`` loops are cut by the rank stream, so
    Energon's (and torch's) epochs never end (see :mod:`rl_data.energon.epoch_stream`).
    """
    exact = source.epoch_mode == "exact"  # never for a mixture (LoaderSpec refuses it)
    dataset = get_train_dataset(
        source.energon_source(),
        batch_drop_last=True,
        shuffle_buffer_size=loader_config.shuffle_buffer_size,
        max_samples_per_sequence=loader_config.max_samples_per_sequence,
        repeat=not exact,
        **common,
    )
    if exact:
        dataset = PassEndDataset(
            dataset, worker_config=worker_config, count_sources=_count_sources
        )
    return dataset
