"""Helpers for tests: generated media (PIL images, WAV via ``wave``, FLAC/MP4 via PyAV) and
small prepared Energon datasets of multimodal and preference samples."""

from __future__ import annotations

import io
import wave
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rl_data.energon.dataset_writer import write_energon_dataset

RATE = 16000


def image_bytes(width: int, height: int, seed: int, fmt: str = "JPEG") -> bytes:
    """A random-noise RGB image encoded as ``fmt`` (JPEG, PNG, WEBP)."""
    from PIL import Image

    pixels = np.random.RandomState(seed).randint(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


def tone(num_samples: int, seed: int) -> np.ndarray:
    """A sine tone plus a little noise, float32 in [-0.5, 0.5]."""
    t = np.arange(num_samples) / RATE
    noise = np.random.RandomState(seed).uniform(-0.05, 0.05, num_samples)
    return (0.4 * np.sin(2 * np.pi * (220 + 40 * seed) * t) + noise).astype(np.float32)


def wav_bytes(waveform: np.ndarray, rate: int = RATE) -> bytes:
    """16-bit PCM mono WAV (stdlib ``wave``)."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes((waveform * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def flac_bytes(waveform: np.ndarray, rate: int = RATE) -> bytes:
    """Mono FLAC (PyAV)."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="flac") as container:
        stream = container.add_stream("flac", rate=rate, layout="mono")
        frame = av.AudioFrame.from_ndarray((waveform[None, :] * 32767).astype(np.int16), format="s16", layout="mono")
        frame.sample_rate = rate
        for packet in (*stream.encode(frame), *stream.encode(None)):
            container.mux(packet)
    return buffer.getvalue()


def mp4_bytes(num_frames: int, width: int, height: int, seed: int) -> bytes:
    """An MPEG-4 video of random frames (PyAV)."""
    import av

    buffer = io.BytesIO()
    frames = np.random.RandomState(seed).randint(0, 256, (num_frames, height, width, 3), dtype=np.uint8)
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=4)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for pixels in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


def user_turn(*parts: Any) -> dict[str, Any]:
    """A user message of text (str) and media parts (dicts)."""
    return {"role": "user", "content": [{"type": "text", "text": p} if isinstance(p, str) else p for p in parts]}


def sft_record(messages: list[dict[str, Any]], row: int) -> dict[str, Any]:
    return {"kind": "sft", "messages": messages, "source": {"file": "generated", "row": row}}


def write_raw_dataset(
    root: str | Path,
    samples: Sequence[tuple[str, Mapping[str, bytes]]],
    *,
    samples_per_shard: int,
    splits: Mapping[str, float],
) -> dict[str, list[str]]:
    """Prepare ``samples`` (already encoded tar members, valid or not) as an Energon dataset;
    returns the keys of every split in written order."""
    shards = write_energon_dataset(root, samples, samples_per_shard=samples_per_shard, splits=splits)
    keys = [key for key, _ in samples]
    split_keys = {}
    for split, shard_paths in shards.items():
        indices = [int(Path(p).stem.split("-")[1]) for p in shard_paths]
        split_keys[split] = [k for i in indices for k in keys[i * samples_per_shard : (i + 1) * samples_per_shard]]
    return split_keys


__all__ = [
    "RATE",
    "flac_bytes",
    "image_bytes",
    "mp4_bytes",
    "sft_record",
    "tone",
    "user_turn",
    "wav_bytes",
    "write_raw_dataset",
]
