"""``BaseSFTTaskEncoder``: Energon task encoder for SFT, unpacked or packed.

Pipeline (Energon 7.4): cooker (raw -> :class:`ChatSample`) -> :meth:`encode_sample`
(-> :class:`EncodedSFTSample`) -> with packing :meth:`select_samples_to_pack` and
:meth:`pack_selected_samples` (-> :class:`PackedSFTSample`) -> :meth:`batch` (->
``BatchedDataDict``). Every stage except ``select_samples_to_pack`` is ``@stateless``:
Energon rebuilds in-flight samples on restore by re-running those stages, and refuses to
restore a packing loader otherwise.

Unpacked batches, ``batch_format="message_log"``: ``message_log`` (list of message logs, no
loss masks: ``only_unmask_final`` is applied by the consumer), ``loss_multiplier`` (float32
``[B]``) and ``source_ids`` (the sample keys); ``batch_format="tensors"``: the padded training
tensors of :func:`~rl_data.energon.task_encoders.collate.padded_sft_tensors` (loss masks and
``only_unmask_final`` applied here) instead of ``message_log``, plus ``loss_multiplier`` and
``source_ids``. Packed batches: see :func:`rl_data.energon.task_encoders.packing.collate_packs`.
A sample whose length reaches ``max_sequence_length`` is truncated (every message cut to
``min(4, max_sequence_length // n_messages)`` tokens) and gets ``loss_multiplier`` 0.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

import torch
from megatron.energon import Cooker, DefaultTaskEncoder, Sample, edataclass, stateless

from rl_data.batched_data_dict import BatchedDataDict
from rl_data.energon.packing_restore import PackingRestoreCache
from rl_data.energon.task_encoders.adapter import ProcessorAdapter
from rl_data.energon.task_encoders.collate import padded_sft_tensors
from rl_data.energon.task_encoders.cookers import ChatCooker
from rl_data.energon.task_encoders.packing import build_pack, collate_packs, select_packs
from rl_data.fingerprint import fingerprint
from rl_data.packing.algorithms import get_packer
from rl_data.tokenization.truncation import truncate_message_log


@edataclass
class EncodedSFTSample(Sample):
    """One tokenised conversation."""

    message_log: list[dict[str, Any]]
    length: int
    loss_multiplier: float
    adapter_fingerprint: str


@edataclass
class PackedSFTSample(Sample):
    """Several encoded conversations laid out in one row (see ``packing.build_pack``)."""

    message_log: list[dict[str, Any]]
    input_ids: torch.Tensor
    token_mask: torch.Tensor
    cu_seqlens: torch.Tensor
    cu_seqlens_padded: torch.Tensor
    zero_loss_sources: int
    source_ids: list[str]


_PACK_FIELDS = ("input_ids", "token_mask", "cu_seqlens", "cu_seqlens_padded", "zero_loss_sources")


class BaseSFTTaskEncoder(
    DefaultTaskEncoder[Sample, EncodedSFTSample, Union[EncodedSFTSample, PackedSFTSample], BatchedDataDict]
):
    """Chat formatting, truncation, batching and (optionally) packing for SFT.

    Subclasses implement :meth:`encode_sample` (``@stateless``), usually as
    ``self.encode_conversation(sample, <messages>, <tools>)`` or
    ``self.finish_encoding(sample, <message_log>)``.
    """

    #: Bump when the encoded output for the same input changes (part of the loader identity).
    COMPONENT_VERSION = 1
    #: Cooker class used when none is given.
    DEFAULT_COOKER: type = ChatCooker
    #: Energon must hand raw bytes to the cooker, which decodes and validates them.
    decoder = None
    #: Whether unpacked batches can be padded tensors (subclasses with their own ``batch``
    #: form say False).
    TENSOR_BATCHES = True
    #: ``batch_format`` values.
    BATCH_FORMATS = ("tensors", "message_log")

    def __init__(
        self,
        *,
        adapter: ProcessorAdapter,
        max_sequence_length: int,
        include_source_ids: bool = True,
        packing_algorithm: Optional[str] = None,
        max_sequences_per_bin: Optional[int] = None,
        sequence_length_pad_multiple: int = 1,
        only_unmask_final: bool = False,
        tokenizer: Any = None,
        cooker: Optional[type] = None,
        packing_seed: int = 0,
        failure_tolerance: Optional[int] = None,
        source_datasets: Optional[Mapping[str, str]] = None,
        batch_format: str = "message_log",
    ) -> None:
        """``cooker`` (a cooker class) None selects :attr:`DEFAULT_COOKER`; ``failure_tolerance``
        overrides Energon's consecutive-failure limit per stage (default 100);
        ``source_datasets`` (dataset path -> mixture member name) adds a ``source_datasets``
        column to every batch: the member of each row (a list per pack); ``batch_format``:
        unpacked batches as ``"message_log"`` or padded ``"tensors"`` (module docstring)."""
        super().__init__()
        if batch_format not in self.BATCH_FORMATS or (batch_format == "tensors" and not self.TENSOR_BATCHES):
            allowed = self.BATCH_FORMATS if self.TENSOR_BATCHES else ("message_log",)
            raise ValueError(
                f"batch_format {batch_format!r} is not available for {type(self).__name__}; "
                f"expected one of {list(allowed)} (data_config['batch_format'], None for the task's default)"
            )
        self.batch_format = batch_format
        self.source_datasets = dict(source_datasets) if source_datasets else None
        if max_sequence_length != adapter.max_sequence_length:
            raise ValueError(
                f"max_sequence_length {max_sequence_length} differs from the adapter's "
                f"{adapter.max_sequence_length}; build the adapter with the same maximum length"
            )
        if tokenizer is not None and tokenizer is not adapter.tokenizer:
            raise ValueError(
                "tokenizer is not the adapter's tokenizer; pass the tokenizer the adapter "
                "was built from (or None)"
            )
        self.adapter = adapter
        self.max_sequence_length = max_sequence_length
        self.include_source_ids = include_source_ids
        self.only_unmask_final = only_unmask_final
        self.sequence_length_pad_multiple = sequence_length_pad_multiple
        self.cooker = cooker or self.DEFAULT_COOKER
        self.cookers = (Cooker(self.cooker.cook),)
        if failure_tolerance is not None:
            self.__default_failure_tolerance__ = failure_tolerance
        self.packer = None
        if packing_algorithm is not None:
            if max_sequence_length % sequence_length_pad_multiple:
                raise ValueError(
                    f"max_sequence_length {max_sequence_length} is not a multiple of "
                    f"sequence_length_pad_multiple {sequence_length_pad_multiple}: a sample "
                    "just below the limit would not fit a pack once padded; choose a multiple"
                )
            self.packer = get_packer(
                packing_algorithm,
                max_sequence_length,
                max_sequences_per_bin=max_sequences_per_bin,
                sequence_length_pad_multiple=sequence_length_pad_multiple,
                seed=packing_seed,
            )

    @property
    def packing(self) -> bool:
        """Whether batches are packed (a packing algorithm was given)."""
        return self.packer is not None

    @property
    def component_versions(self) -> dict[str, int]:
        """Versions of the encoder and cooker classes, for the loader identity."""
        return {
            type(self).__name__: self.COMPONENT_VERSION,
            self.cooker.__name__: self.cooker.COMPONENT_VERSION,
        }

    def finish_encoding(self, sample: Sample, message_log: list[dict[str, Any]]) -> EncodedSFTSample:
        """Truncate ``message_log`` if it reaches the maximum length and wrap it as a sample."""
        return self.encoded(sample, *truncate_message_log(message_log, self.max_sequence_length))

    def encode_conversation(
        self, sample: Sample, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> EncodedSFTSample:
        """Format and truncate ``messages`` (:meth:`ProcessorAdapter.format_truncated`) into a sample."""
        return self.encoded(sample, *self.adapter.format_truncated(messages, tools, self.max_sequence_length))

    def encoded(
        self, sample: Sample, message_log: list[dict[str, Any]], length: int, loss_multiplier: float
    ) -> EncodedSFTSample:
        """A truncated message log, its length and loss multiplier as a sample derived from ``sample``."""
        return EncodedSFTSample.derive_from(
            sample,
            message_log=message_log,
            length=length,
            loss_multiplier=loss_multiplier,
            adapter_fingerprint=self.adapter.fingerprint,
        )

    def build_batch(self, dataset: Any, *, packing_buffer_size: Optional[int] = None, **options: Any) -> Any:
        """Energon's batching; packing reads through a :class:`PackingRestoreCache`, so a restored
        loader gets the packing buffers' encoded samples from the state instead of re-encoding."""
        if packing_buffer_size is None:
            return super().build_batch(dataset, **options)
        cache = PackingRestoreCache(
            dataset,
            sample_type=EncodedSFTSample,
            fingerprint=fingerprint({"adapter": self.adapter.fingerprint, "components": self.component_versions}),
            worker_config=options["worker_config"],
        )
        return cache.feeding(super().build_batch(cache, packing_buffer_size=packing_buffer_size, **options))

    def select_samples_to_pack(self, samples: list[EncodedSFTSample]) -> list[list[EncodedSFTSample]]:
        """Bins of the packing algorithm over the buffer; fingerprints never mix in a bin."""
        self._require_packing("select_samples_to_pack")
        bins = select_packs(
            [s.length for s in samples], [s.adapter_fingerprint for s in samples], self.packer
        )
        return [[samples[i] for i in bin_] for bin_ in bins]

    @stateless
    def pack_selected_samples(self, samples: list[EncodedSFTSample]) -> PackedSFTSample:
        """Lay out one pack (masks, first-token masking, padding messages)."""
        self._require_packing("pack_selected_samples")
        pack = build_pack(
            [s.message_log for s in samples],
            [s.loss_multiplier for s in samples],
            pad_multiple=self.sequence_length_pad_multiple,
            pad_token_id=self.adapter.pad_token_id,
            only_unmask_final=self.only_unmask_final,
        )
        keys = [s.__key__ for s in samples]
        return PackedSFTSample(
            __key__=",".join(keys),
            __restore_key__=(),
            __subflavors__=samples[0].__subflavors__,
            __sources__=tuple(src for s in samples for src in (s.__sources__ or ())),
            source_ids=keys,
            **pack,
        )

    @stateless
    def batch(self, samples: list[Union[EncodedSFTSample, PackedSFTSample]]) -> BatchedDataDict:
        """An unpacked or packed ``BatchedDataDict`` (see the module docstring)."""
        expected = PackedSFTSample if self.packing else EncodedSFTSample
        found = {type(s).__name__ for s in samples}
        if found != {expected.__name__}:
            raise TypeError(
                f"batch got {sorted(found)} samples but this encoder expects "
                f"{expected.__name__} (packing_algorithm set: {self.packing}); set "
                "packing_buffer_size exactly when a packing algorithm is configured"
            )
        if self.packing:
            batch = collate_packs(
                [
                    {field: getattr(s, field) for field in _PACK_FIELDS}
                    for s in samples
                ],
                pad_token_id=self.adapter.pad_token_id,
                capacity=self.max_sequence_length,
                source_ids=[s.source_ids for s in samples] if self.include_source_ids else None,
            )
            return self.with_source_datasets(batch, samples)
        multipliers = [s.loss_multiplier for s in samples]
        if self.batch_format == "tensors":
            batch = padded_sft_tensors(
                [s.message_log for s in samples],
                multipliers,
                pad_token_id=self.adapter.pad_token_id,
                pad_multiple=self.sequence_length_pad_multiple,
                only_unmask_final=self.only_unmask_final,
            )
        else:
            batch = BatchedDataDict(message_log=[s.message_log for s in samples])
        batch["loss_multiplier"] = torch.tensor(multipliers, dtype=torch.float32)
        if self.include_source_ids:
            batch["source_ids"] = [s.__key__ for s in samples]
        return self.with_source_datasets(batch, samples)

    def with_source_datasets(self, batch: BatchedDataDict, samples: list[Any]) -> BatchedDataDict:
        """``batch`` plus, for a mixture, the ``source_datasets`` column (see ``__init__``)."""
        if self.source_datasets is None:
            return batch
        if self.packing:
            batch["source_datasets"] = [[self._member(src) for src in s.__sources__ or ()] for s in samples]
        else:
            batch["source_datasets"] = [self._member((s.__sources__ or (None,))[0]) for s in samples]
        return batch

    def _member(self, source: Any) -> str:
        path = str(getattr(source, "dataset_path", ""))
        return self.source_datasets.get(path, path or "unknown")

    def _require_packing(self, stage: str) -> None:
        if not self.packing:
            raise RuntimeError(
                f"{stage} was called but this encoder has no packing_algorithm; configure "
                "packing_algorithm together with packing_buffer_size"
            )
