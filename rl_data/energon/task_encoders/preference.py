"""``PreferenceTaskEncoder``: preference pairs -> ``PreferenceDatumSpec``-shaped batches.

A preference sample (``{"kind": "preference", "context", "chosen", "rejected"}``, see
:mod:`rl_data.energon.sample_format`) becomes two message logs, ``context + chosen`` and
``context + rejected``, each formatted through the adapter's chat template. Each log follows
the SFT truncation rule on its own; the pair's ``loss_multiplier`` is 0 when either log was cut.

It runs in the same loader as SFT (``task_encoder: preference``), so state, identity, restore
and bad-sample handling are the SFT loader's. Pairs are never packed. Batches:
``message_log_chosen`` / ``message_log_rejected`` (lists of message logs), ``length_chosen`` /
``length_rejected`` (int64 ``[B]``), ``loss_multiplier`` (float32 ``[B]``) and ``source_ids``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from megatron.energon import Sample, basic_sample_keys, edataclass, stateless

from rl_data.batched_data_dict import BatchedDataDict
from rl_data.energon.task_encoders.base import BaseSFTTaskEncoder
from rl_data.energon.task_encoders.cookers import decode_record
from rl_data.tokenization.validation import validate_messages

_PAIR_FIELDS = ("context", "chosen", "rejected")


@edataclass
class PreferenceSample(Sample):
    """One canonical preference pair, as stored in the dataset."""

    context: list[dict[str, Any]]
    chosen: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    tools: Optional[list[dict[str, Any]]]
    source: dict[str, Any]
    task_name: Optional[str]


@edataclass
class EncodedPreferenceSample(Sample):
    """Both completions of a pair, tokenised."""

    message_log_chosen: list[dict[str, Any]]
    message_log_rejected: list[dict[str, Any]]
    length_chosen: int
    length_rejected: int
    loss_multiplier: float


class PreferenceCooker:
    """Cooks the ``json`` member of a crude preference sample into a :class:`PreferenceSample`."""

    #: Bump when the cooked output for the same input changes (part of the loader identity).
    COMPONENT_VERSION = 1

    @staticmethod
    @stateless
    def cook(raw: dict[str, Any]) -> PreferenceSample:
        """Decode and validate; ``ValueError`` for another kind, empty lists or bad messages."""
        key, record = decode_record(raw, "preference", reader="the preference cooker")
        for name in _PAIR_FIELDS:
            value = record.get(name)
            if not isinstance(value, list) or not value:
                raise ValueError(f"sample {key!r}: {name!r} must be a non-empty message list, found {value!r:.80}")
        for name in ("chosen", "rejected"):
            try:
                validate_messages(record["context"] + record[name])
            except ValueError as error:
                raise ValueError(f"sample {key!r}, context + {name}: {error}") from None
        return PreferenceSample(
            **basic_sample_keys(raw),
            **{name: record[name] for name in _PAIR_FIELDS},
            tools=record.get("tools"),
            source=record.get("source") or {},
            task_name=record.get("task_name"),
        )


class PreferenceTaskEncoder(BaseSFTTaskEncoder):
    """Tokenises preference pairs (see the module docstring); packing is refused."""

    COMPONENT_VERSION = 1
    DEFAULT_COOKER = PreferenceCooker
    TENSOR_BATCHES = False

    def __init__(self, **options: Any) -> None:
        if options.get("packing_algorithm") is not None:
            raise ValueError(
                f"the preference task encoder does not pack (packing_algorithm="
                f"{options['packing_algorithm']!r}); set packing_algorithm None and remove "
                "packing_buffer_size"
            )
        super().__init__(**options)

    @stateless
    def encode_sample(self, sample: PreferenceSample) -> EncodedPreferenceSample:
        """Format and truncate both completions."""
        logs, lengths, multiplier = {}, {}, 1.0
        for name in ("chosen", "rejected"):
            logs[name], lengths[name], kept = self.adapter.format_truncated(
                sample.context + getattr(sample, name), sample.tools, self.max_sequence_length
            )
            multiplier = min(multiplier, kept)
        return EncodedPreferenceSample.derive_from(
            sample,
            message_log_chosen=logs["chosen"],
            message_log_rejected=logs["rejected"],
            length_chosen=lengths["chosen"],
            length_rejected=lengths["rejected"],
            loss_multiplier=multiplier,
        )

    @stateless
    def batch(self, samples: list[EncodedPreferenceSample]) -> BatchedDataDict:
        """A ``PreferenceDatumSpec``-shaped batch (see the module docstring)."""
        batch = BatchedDataDict(
            message_log_chosen=[s.message_log_chosen for s in samples],
            message_log_rejected=[s.message_log_rejected for s in samples],
            length_chosen=torch.tensor([s.length_chosen for s in samples], dtype=torch.long),
            length_rejected=torch.tensor([s.length_rejected for s in samples], dtype=torch.long),
            loss_multiplier=torch.tensor([s.loss_multiplier for s in samples], dtype=torch.float32),
        )
        if self.include_source_ids:
            batch["source_ids"] = [s.__key__ for s in samples]
        return self.with_source_datasets(batch, samples)
