"""Decoding media members (images, videos, audio) and the ``TaskDataSpec`` media settings.

Pure functions from member bytes to arrays; nothing here knows Energon or the processor.

* Images (jpg/jpeg/png/webp) -> RGB ``PIL.Image`` (fully decoded, so a truncated file fails here).
* Videos: an ``mp4`` member decoded with PyAV (``av``, optional: install ``rl_data[multimodal]``),
  or a frame sequence (a list of image members). ``num_frames`` frames are picked uniformly.
* Audio: ``wav`` (PCM 8/16/32-bit, stdlib ``wave``) or ``flac`` (PyAV), mixed down to mono
  float32 and resampled with PyAV when its rate is not the feature extractor's.
"""

from __future__ import annotations

import io
import wave
from collections.abc import Sequence
from typing import Any, Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from rl_data.energon.sample_format import media_extension, media_references

#: TaskDataSpec media fields this processor cannot honour; setting one is refused.
UNSUPPORTED_SPEC_FIELDS = (
    "video_target_num_patches",
    "video_temporal_patch_size",
    "video_maintain_aspect_ratio",
)


class MediaSettings(BaseModel):
    """How media are turned into model inputs (the ``TaskDataSpec`` media fields).

    ``image_max_num_tiles`` caps the tiles of one image, a tile being one merged patch
    (``(patch_size * merge_size)**2`` pixels, i.e. one ``<|image_pad|>`` token): larger images
    are downscaled by the image processor. ``num_frames`` is the number of frames taken from
    each video (uniformly spaced; a shorter video keeps all its frames). With
    ``pad_audio_to_hop_length`` a clip is zero-padded to a multiple of the hop length and its
    features cover just the clip; without it, Whisper's default (pad or cut to 30 s).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_frames: Optional[int] = Field(default=None, ge=1)
    video_sampling_style: Literal["uniform"] = "uniform"
    image_max_num_tiles: Optional[int] = Field(default=None, ge=1)
    pad_audio_to_hop_length: bool = False

    @classmethod
    def from_task_data_spec(cls, spec: Any) -> "MediaSettings":
        """Read the media fields of a ``TaskDataSpec`` (None fields keep the defaults)."""
        for name in UNSUPPORTED_SPEC_FIELDS:
            if getattr(spec, name, None) is not None:
                raise ValueError(
                    f"TaskDataSpec.{name}={getattr(spec, name)!r} is not supported: video frames "
                    "go through the Qwen2-VL-style image processor one by one (each frame is "
                    f"one temporal patch); leave {name} None"
                )
        values = {
            name: getattr(spec, name)
            for name in ("num_frames", "video_sampling_style", "image_max_num_tiles", "pad_audio_to_hop_length")
            if getattr(spec, name, None) is not None
        }
        return cls(**values)


def decode_image(data: bytes, member: str) -> Any:
    """A fully decoded RGB ``PIL.Image``; ``ValueError`` naming the member when undecodable."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return image.convert("RGB")
    except (OSError, SyntaxError, ValueError) as error:  # PIL's errors for broken files
        raise ValueError(f"image member {member!r} cannot be decoded ({len(data)} bytes): {error}") from None


def sample_frame_indices(total: int, num_frames: Optional[int]) -> list[int]:
    """Uniformly spaced frame indices (all frames when ``num_frames`` is None or >= total)."""
    if total < 1:
        raise ValueError("a video needs at least one frame, found none")
    if num_frames is None or num_frames >= total:
        return list(range(total))
    if num_frames == 1:
        return [0]
    return [round(i * (total - 1) / (num_frames - 1)) for i in range(num_frames)]


def decode_video(
    members: dict[str, bytes], reference: str | Sequence[str], num_frames: Optional[int]
) -> list[Any]:
    """The sampled RGB frames of a video: one ``mp4`` member or a list of image members."""
    if isinstance(reference, str):
        frames = _decode_mp4(members[reference], reference)
        indices = sample_frame_indices(len(frames), num_frames)
        return [frames[i] for i in indices]
    indices = sample_frame_indices(len(reference), num_frames)
    frames = [decode_image(members[reference[i]], reference[i]) for i in indices]
    sizes = {frame.size for frame in frames}
    if len(sizes) > 1:
        raise ValueError(
            f"video frames {list(reference)} have different sizes {sorted(sizes)}; every frame "
            "of a video must have the same width and height"
        )
    return frames


def _require_av(what: str) -> Any:
    try:
        import av
    except ImportError:
        raise ValueError(
            f"{what} needs PyAV, which is not installed; install it with "
            "`pip install 'rl_data[multimodal]'` (or `pip install av`)"
        ) from None
    return av


def _decode_mp4(data: bytes, member: str) -> list[Any]:
    av = _require_av(f"video member {member!r}")
    try:
        with av.open(io.BytesIO(data)) as container:
            frames = [frame.to_image().convert("RGB") for frame in container.decode(video=0)]
    except (av.FFmpegError, IndexError, ValueError) as error:
        raise ValueError(f"video member {member!r} cannot be decoded ({len(data)} bytes): {error}") from None
    if not frames:
        raise ValueError(f"video member {member!r} holds no video frames")
    return frames


def decode_audio(data: bytes, member: str, sampling_rate: int) -> np.ndarray:
    """Mono float32 samples in [-1, 1] at ``sampling_rate``."""
    extension = media_extension(member)
    if extension == "wav":
        waveform, rate = _decode_wav(data, member)
        if rate == sampling_rate:
            return waveform
        return _resample(waveform, rate, sampling_rate, member)
    return _decode_with_av(data, member, sampling_rate)


def _decode_wav(data: bytes, member: str) -> tuple[np.ndarray, int]:
    try:
        with wave.open(io.BytesIO(data)) as reader:
            width, channels, rate = reader.getsampwidth(), reader.getnchannels(), reader.getframerate()
            raw = reader.readframes(reader.getnframes())
    except (wave.Error, EOFError) as error:
        raise ValueError(f"audio member {member!r} is not a readable WAV file: {error}") from None
    dtypes = {1: np.uint8, 2: np.int16, 4: np.int32}
    if width not in dtypes:
        raise ValueError(
            f"audio member {member!r} has {8 * width}-bit samples; WAV members must be 8, 16 or "
            "32-bit PCM (convert it, or store it as FLAC)"
        )
    samples = np.frombuffer(raw, dtype=dtypes[width]).astype(np.float32)
    if len(samples) % channels:
        raise ValueError(f"audio member {member!r} is truncated (incomplete last frame)")
    samples = (samples - 128.0) / 128.0 if width == 1 else samples / float(2 ** (8 * width - 1))
    return samples.reshape(-1, channels).mean(axis=1), rate


def _resample(waveform: np.ndarray, rate: int, target: int, member: str) -> np.ndarray:
    av = _require_av(f"resampling audio member {member!r} from {rate} Hz to {target} Hz")
    frame = av.AudioFrame.from_ndarray(waveform[None, :].astype(np.float32), format="flt", layout="mono")
    frame.sample_rate = rate
    resampler = av.AudioResampler(format="flt", layout="mono", rate=target)
    chunks = [f.to_ndarray()[0] for f in (*resampler.resample(frame), *resampler.resample(None))]
    return np.concatenate(chunks).astype(np.float32)


def _decode_with_av(data: bytes, member: str, sampling_rate: int) -> np.ndarray:
    av = _require_av(f"audio member {member!r}")
    resampler = av.AudioResampler(format="flt", layout="mono", rate=sampling_rate)
    chunks: list[np.ndarray] = []
    try:
        with av.open(io.BytesIO(data)) as container:
            for frame in container.decode(audio=0):
                chunks.extend(f.to_ndarray()[0] for f in resampler.resample(frame))
        chunks.extend(f.to_ndarray()[0] for f in resampler.resample(None))
    except (av.FFmpegError, IndexError, ValueError) as error:
        raise ValueError(f"audio member {member!r} cannot be decoded ({len(data)} bytes): {error}") from None
    if not chunks:
        raise ValueError(f"audio member {member!r} holds no audio samples")
    return np.concatenate(chunks).astype(np.float32)


def check_media_decodable(sample: Any, members: dict[str, bytes], sampling_rate: int = 16000) -> None:
    """Decode every media member ``sample`` references; ``ValueError`` naming the first bad one.

    For writers that quarantine undecodable rows before they reach a shard (the loader would
    skip them with a log line). Run :func:`~rl_data.energon.sample_format.check_media_members`
    first so that every reference has a member.
    """
    for part_type, member in media_references(sample):
        if part_type == "audio":
            decode_audio(members[member], member, sampling_rate)
        elif part_type == "video":
            _decode_mp4(members[member], member)
        else:
            decode_image(members[member], member)
