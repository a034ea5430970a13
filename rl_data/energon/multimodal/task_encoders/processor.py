"""An offline multimodal processor: Qwen2-VL image processor + Whisper features + tokenizer.

transformers' ``Qwen2VLProcessor`` needs a video processor, which needs torchvision (not
installable beside the CPU torch here), so the parts are composed explicitly, all built from
transformers classes with their default configurations (no hub):

* images: ``Qwen2VLImageProcessorPil`` -> ``pixel_values [patches, 1176]``, ``image_grid_thw
  [1, 3]``; the text holds ``<|vision_start|>`` + ``<|image_pad|>`` x (t*h*w / merge_size**2)
  + ``<|vision_end|>``.
* videos: the sampled frames go through the same image processor, each frame one temporal patch
  (the frame repeated ``temporal_patch_size`` times, as for an image): ``pixel_values_videos
  [frames*h*w, 1176]``, ``video_grid_thw [[frames, h, w]]``, ``<|video_pad|>`` placeholders.
* audio: ``WhisperFeatureExtractor`` -> ``input_features [80, T]`` (packed along time) and
  ``audio_feature_lengths [1]`` = T; ``(T - 1) // 2 + 1`` ``<|audio_pad|>`` placeholders (the
  length of Whisper's encoder output) between ``<|audio_start|>`` and ``<|audio_end|>``.

The chat template is the tokenizer's: media parts become these placeholder runs as text before
the conversation is templated. :attr:`MultimodalProcessor.fingerprint` pins everything that
changes the media tensors or placeholders (the tokenizer itself is pinned by the adapter).
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Any, Optional

import numpy as np
import torch

from rl_data.energon.multimodal.task_encoders.media import MediaSettings
from rl_data.tokenization.vision_tokens import (
    AUDIO_END,
    AUDIO_PAD,
    AUDIO_START,
    IMAGE_PAD,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    media_token_ids,
    with_media_tokens,
)

#: Batch/message media keys and the dimension their PackedTensors concatenate along.
MEDIA_KEYS_BY_MODALITY: dict[str, dict[str, int]] = {
    "image": {"pixel_values": 0, "image_grid_thw": 0},
    "video": {"pixel_values_videos": 0, "video_grid_thw": 0},
    "audio": {"input_features": 1, "audio_feature_lengths": 0},
}


class MultimodalProcessor:
    """Turns decoded media into model inputs and placeholder text (see the module docstring).

    ``tokenizer`` must hold the media placeholder tokens (use :func:`with_media_tokens`);
    ``image_processor`` enables images and videos, ``feature_extractor`` audio.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        image_processor: Any = None,
        feature_extractor: Any = None,
        settings: MediaSettings = MediaSettings(),
    ) -> None:
        if image_processor is None and feature_extractor is None:
            raise ValueError("a multimodal processor needs an image processor, a feature extractor or both")
        self.media_token_ids = media_token_ids(tokenizer)
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.feature_extractor = feature_extractor
        self.settings = settings

    @property
    def modalities(self) -> tuple[str, ...]:
        """The part types this processor encodes."""
        image = ("image", "video") if self.image_processor is not None else ()
        return image + (("audio",) if self.feature_extractor is not None else ())

    @property
    def media_keys(self) -> dict[str, int]:
        """Media key -> ``dim_to_pack`` for every key this processor produces."""
        return {k: d for m in self.modalities for k, d in MEDIA_KEYS_BY_MODALITY[m].items()}

    def process_image(self, image: Any) -> dict[str, torch.Tensor]:
        """``pixel_values`` and ``image_grid_thw`` of one RGB image."""
        out = self.image_processor(images=[image], return_tensors="pt", **self._image_kwargs())
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}

    def process_video(self, frames: list[Any]) -> dict[str, torch.Tensor]:
        """``pixel_values_videos`` and ``video_grid_thw`` (``[[frames, h, w]]``) of a video's frames."""
        out = self.image_processor(images=list(frames), return_tensors="pt")
        grids = out["image_grid_thw"]
        if not bool((grids[:, 1:] == grids[0, 1:]).all()):
            raise ValueError(f"video frames were resized to different grids {grids.tolist()}; frames must share a size")
        grid = torch.tensor([[len(frames), int(grids[0, 1]), int(grids[0, 2])]], dtype=grids.dtype)
        return {"pixel_values_videos": out["pixel_values"], "video_grid_thw": grid}

    def process_audio(self, waveform: np.ndarray) -> dict[str, torch.Tensor]:
        """``input_features [n_mels, T]`` and ``audio_feature_lengths [1]`` of one mono clip."""
        extractor = self.feature_extractor
        kwargs: dict[str, Any] = {}
        if self.settings.pad_audio_to_hop_length:
            kwargs = {"padding": "longest", "pad_to_multiple_of": extractor.hop_length}
        out = extractor(waveform, sampling_rate=extractor.sampling_rate, return_tensors="pt", **kwargs)
        features = out["input_features"][0]
        return {
            "input_features": features,
            "audio_feature_lengths": torch.tensor([features.shape[-1]], dtype=torch.long),
        }

    def placeholder(self, part_type: str, features: dict[str, torch.Tensor]) -> str:
        """The placeholder text of one processed media item."""
        if part_type == "audio":
            frames = int(features["audio_feature_lengths"][0])
            return AUDIO_START + AUDIO_PAD * ((frames - 1) // 2 + 1) + AUDIO_END
        grid = features["image_grid_thw" if part_type == "image" else "video_grid_thw"][0]
        tokens = int(grid.prod()) // self.image_processor.merge_size**2
        return VISION_START + (IMAGE_PAD if part_type == "image" else VIDEO_PAD) * tokens + VISION_END

    @cached_property
    def identity(self) -> dict[str, Any]:
        """Plain JSON of everything that decides the media tensors and placeholders."""
        parts = {"image_processor": self.image_processor, "feature_extractor": self.feature_extractor}
        return {
            **{name: None if p is None else json.loads(p.to_json_string()) for name, p in parts.items()},
            "settings": self.settings.model_dump(mode="json"),
            "media_token_ids": self.media_token_ids,
        }

    @cached_property
    def fingerprint(self) -> str:
        """sha256 hex of the canonical JSON of :attr:`identity`."""
        canonical = json.dumps(self.identity, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def _image_kwargs(self) -> dict[str, Any]:
        tiles = self.settings.image_max_num_tiles
        if tiles is None:
            return {}
        processor = self.image_processor
        cap = tiles * (processor.patch_size * processor.merge_size) ** 2
        return {"size": {"shortest_edge": min(processor.size["shortest_edge"], cap), "longest_edge": cap}}


def build_multimodal_processor(
    tokenizer: Any, *, task_data_spec: Any = None, images: bool = True, audio: bool = True
) -> MultimodalProcessor:
    """A processor from transformers' default Qwen2-VL image processor and Whisper feature
    extractor (no hub) over ``with_media_tokens(tokenizer)``, honouring the media fields of
    ``task_data_spec`` (see :class:`MediaSettings`)."""
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    settings = MediaSettings() if task_data_spec is None else MediaSettings.from_task_data_spec(task_data_spec)
    return MultimodalProcessor(
        with_media_tokens(tokenizer),
        image_processor=Qwen2VLImageProcessorPil() if images else None,
        feature_extractor=WhisperFeatureExtractor() if audio else None,
        settings=settings,
    )


def load_default_multimodal_processor(cache_dir: Optional[str] = None) -> MultimodalProcessor:
    """The Qwen3 tokenizer with images, videos and audio (a ``processor_factory`` for the runtime)."""
    from rl_data.tokenization.tokenizer import load_qwen3_tokenizer

    return build_multimodal_processor(load_qwen3_tokenizer(cache_dir))
