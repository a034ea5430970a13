"""``VLMSFTTaskEncoder``: chat conversations with images, videos and audio -> SFT samples.

The :class:`MultimodalChatCooker` checks a crude sample's media members against the references
in its messages (see :mod:`rl_data.energon.sample_format`) and keeps their bytes. The encoder
decodes each media part, runs the :class:`MultimodalProcessor`, replaces the part with its
placeholder text and formats the conversation through the adapter's chat template. Each
message of the ``message_log`` carries the media of its own parts as one-row ``PackedTensor``s
(``pixel_values``, ``image_grid_thw``, ``pixel_values_videos``, ``video_grid_thw``,
``input_features``, ``audio_feature_lengths``; concatenated in part order).

Truncation keeps the SFT rule and empties the media: every media tensor of a cut sample
becomes empty along its packing dimension and the media tokens left in its ids become the pad
token, so placeholders and media rows always agree; ``loss_multiplier`` is 0.

Batches (packed or not) add one ``PackedTensor`` per media key of the processor, with one row
per batch row: the row's media in token order (for a pack: its sources' media, source after
source), ``None`` when the row has none. ``BatchedDataDict.get_multimodal_dict`` returns them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Union

import torch
from megatron.energon import Sample, basic_sample_keys, edataclass, stateless

from rl_data.batched_data_dict import BatchedDataDict
from rl_data.energon.multimodal.task_encoders.media import decode_audio, decode_image, decode_video
from rl_data.energon.multimodal.task_encoders.processor import MultimodalProcessor
from rl_data.energon.sample_format import check_media_members, is_media_part, media_members
from rl_data.energon.task_encoders.base import BaseSFTTaskEncoder, EncodedSFTSample, PackedSFTSample
from rl_data.energon.task_encoders.cookers import ChatSample, decode_record, sft_messages
from rl_data.interfaces import VLMMessageLogType
from rl_data.packed_tensor import PackedTensor
from rl_data.tokenization.validation import validate_messages
from rl_data.tokenization.validation import TrustedText

_MISSING_PART = {"image": "image processor", "video": "image processor", "audio": "feature extractor"}


@edataclass
class MultimodalChatSample(ChatSample):
    """A canonical SFT conversation and the bytes of the media members it references."""

    #: Member name (``"<name>.<ext>"``) -> bytes.
    media: dict[str, bytes]


class MultimodalChatCooker:
    """Cooks a crude sample with media members into a :class:`MultimodalChatSample`."""

    #: Bump when the cooked output for the same input changes (part of the loader identity).
    COMPONENT_VERSION = 1

    @staticmethod
    @stateless
    def cook(raw: dict[str, Any]) -> MultimodalChatSample:
        """Decode the JSON, check media references against members, validate the messages.

        Raises ``ValueError`` for a missing or unreferenced member, a malformed media part or
        any problem the text cooker rejects (the loader logs and skips the sample).
        """
        key, record = decode_record(raw, "sft", reader="the multimodal chat cooker")
        messages = sft_messages(key, record)
        media = media_members(raw)
        check_media_members(record, media)
        validate_messages([_text_view(m) for m in messages])
        return MultimodalChatSample(
            **basic_sample_keys(raw),
            messages=messages,
            tools=record.get("tools"),
            source=record.get("source") or {},
            task_name=record.get("task_name"),
            media=media,
        )


def _text_view(message: Any) -> Any:
    """The message with every media part replaced by an empty text part (for validation)."""
    content = message.get("content") if isinstance(message, Mapping) else None
    if not isinstance(content, list):
        return message
    parts = [{"type": "text", "text": ""} if is_media_part(p) else p for p in content]
    return {**message, "content": parts}


def expand_media(
    messages: Sequence[Mapping[str, Any]], media: Mapping[str, bytes], processor: MultimodalProcessor
) -> tuple[list[dict[str, Any]], list[dict[str, PackedTensor]]]:
    """Messages whose media parts became placeholder text, and each message's media tensors."""
    texts: list[dict[str, Any]] = []
    tensors: list[dict[str, PackedTensor]] = []
    for index, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list) or not any(is_media_part(p) for p in content):
            texts.append(dict(message))
            tensors.append({})
            continue
        parts, collected = [], {}
        for part in content:
            if not is_media_part(part):
                parts.append(part)
                continue
            features = _process_part(part, media, processor, where=f"message {index}")
            parts.append({"type": "text", "text": TrustedText(processor.placeholder(part["type"], features))})
            for name, tensor in features.items():
                collected.setdefault(name, []).append(tensor)
        texts.append({**message, "content": parts})
        dims = processor.media_keys
        tensors.append({k: PackedTensor([_joined(v, dims[k])], dims[k]) for k, v in collected.items()})
    return texts, tensors


def _joined(tensors: list[torch.Tensor], dim: int) -> torch.Tensor:
    """One message's tensors of a media key as one; a single one (one image: ~4.8 MB of patches
    at 448 x 448) is kept as the processor made it, not copied."""
    return tensors[0].contiguous() if len(tensors) == 1 else torch.cat(tensors, dim)


def _process_part(
    part: Mapping[str, Any], media: Mapping[str, bytes], processor: MultimodalProcessor, *, where: str
) -> dict[str, torch.Tensor]:
    part_type = part["type"]
    if part_type not in processor.modalities:
        raise ValueError(
            f"{where} has a media part of type {part_type!r} but the processor has no {_MISSING_PART[part_type]} "
            f"(it encodes {list(processor.modalities)}); build the processor with {part_type} support"
        )
    reference = part[part_type]
    if part_type == "image":
        return processor.process_image(decode_image(media[reference], reference))
    if part_type == "video":
        return processor.process_video(decode_video(dict(media), reference, processor.settings.num_frames))
    rate = processor.feature_extractor.sampling_rate
    return processor.process_audio(decode_audio(media[reference], reference, rate))


def empty_media(message_log: VLMMessageLogType, media_token_ids: Sequence[int], pad_token_id: int) -> VLMMessageLogType:
    """Copies of the messages with every PackedTensor emptied and media tokens set to ``pad_token_id``."""
    media_ids = torch.tensor(sorted(media_token_ids), dtype=torch.long)
    emptied = []
    for message in message_log:
        copy = dict(message)
        for key, value in message.items():
            if isinstance(value, PackedTensor):
                rows = [None if t is None else t.narrow(value.dim_to_pack, 0, 0).clone() for t in value.tensors]
                copy[key] = PackedTensor(rows, value.dim_to_pack)
        ids = message["token_ids"]
        copy["token_ids"] = torch.where(torch.isin(ids, media_ids), torch.full_like(ids, pad_token_id), ids)
        emptied.append(copy)
    return emptied


def collate_media(message_logs: Sequence[VLMMessageLogType], media_keys: Mapping[str, int]) -> dict[str, PackedTensor]:
    """One PackedTensor per media key, one row per log: its messages' media in order, or None."""
    collated = {}
    for key, dim in media_keys.items():
        rows: list[torch.Tensor | None] = []
        for log in message_logs:
            parts = [t for m in log if isinstance(m.get(key), PackedTensor) for t in m[key].tensors if t is not None]
            rows.append(None if not parts else parts[0] if len(parts) == 1 else torch.cat(parts, dim))  # one: no copy
        collated[key] = PackedTensor(rows, dim)
    return collated


class VLMSFTTaskEncoder(BaseSFTTaskEncoder):
    """SFT over conversations with media; needs a :class:`MultimodalProcessor` (see module doc)."""

    COMPONENT_VERSION = 1
    DEFAULT_COOKER = MultimodalChatCooker

    def __init__(self, *, processor: Any, **options: Any) -> None:
        super().__init__(**options)
        if not isinstance(processor, MultimodalProcessor):
            raise ValueError(
                f"the multimodal task encoder needs a MultimodalProcessor, got {type(processor).__name__} "
                "(a text-only tokenizer cannot encode images, videos or audio); pass "
                "build_multimodal_processor(tokenizer) as the processor, or use the 'chat_sft' encoder"
            )
        if processor.tokenizer is not self.adapter.tokenizer:
            raise ValueError(
                "the processor's tokenizer is not the adapter's; build the adapter from the "
                "processor (ProcessorAdapter.from_processor(processor, ...))"
            )
        self.processor = processor
        self._media_token_ids = sorted(processor.media_token_ids.values())

    @property
    def component_versions(self) -> dict[str, Any]:
        """Encoder and cooker versions plus the fingerprint of the media processor."""
        return {**super().component_versions, "media_processor": self.processor.fingerprint}

    @stateless
    def encode_sample(self, sample: MultimodalChatSample) -> EncodedSFTSample:
        """Decode and process the media, then tokenise; raises ``ValueError`` for bad media."""
        messages, media = expand_media(sample.messages, sample.media, self.processor)
        message_log = self.adapter.format(messages, sample.tools)
        for message, tensors in zip(message_log, media, strict=True):
            message.update(tensors)
        return self.finish_encoding(sample, message_log)

    def finish_encoding(self, sample: Sample, message_log: list[dict[str, Any]]) -> EncodedSFTSample:
        """The SFT truncation rule; a cut sample also loses its media (see the module doc)."""
        encoded = super().finish_encoding(sample, message_log)
        if encoded.loss_multiplier == 0.0:
            encoded.message_log = empty_media(encoded.message_log, self._media_token_ids, self.adapter.pad_token_id)
        return encoded

    @stateless
    def batch(self, samples: list[Union[EncodedSFTSample, PackedSFTSample]]) -> BatchedDataDict:
        """The SFT batch plus one ``PackedTensor`` per media key (one row per batch row)."""
        batch = super().batch(samples)
        batch.update(collate_media([s.message_log for s in samples], self.processor.media_keys))
        return batch
