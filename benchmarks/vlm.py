"""The VLM workload: image questions with realistically sized photo-like JPEGs, on disk twice.

Every sample is one user turn (a ``vlm_image_size`` x ``vlm_image_size`` JPEG, then a question
about it) and one assistant answer (``rl_data.demo_data``'s shapes, colours and question
templates). The picture is photo-like rather than flat: a smooth random colour field (a few
random pixels upscaled bicubically), mid-frequency texture, sensor-like noise, and the shape of
``shape_picture`` composited on top, saved as JPEG quality 90 (~40-60 KB at 448 x 448, like a
photo; flat synthetic pictures would make decoding trivially cheap). Everything is seeded, so
the set is deterministic; it is written once per recipe into a cache folder:

* an Energon dataset of the canonical ``sft`` sample JSON plus its ``image.jpg`` member, for the
  rank actors (task ``vlm_sft``, processor ``load_default_multimodal_processor``);
* the same JSON lines as JSONL files plus one JPEG file per sample (``images/<key>.jpg``), the
  way VLM data is usually laid out for a map-style loader.

The per-sample work is the project's in both contenders: the rank actors run ``vlm_sft``'s
cooker and ``VLMSFTTaskEncoder`` inside Energon; the ``StatefulDataLoader`` contender calls the
same ``MultimodalChatCooker.cook`` and ``VLMSFTTaskEncoder.encode_sample`` / ``batch`` on the
same bytes (:class:`VlmSampleEncoder`): image decode, the Qwen2-VL image processor, placeholder
expansion and the chat formatting. Both then turn a batch into the common training batch with
:func:`vlm_training_batch` (text as :func:`benchmarks.encoding.training_batch` leaves it: padded
by the encoder when the batch format is ``"tensors"``, else padded there; the batch-level media
tensors kept and counted). The loader contender builds its encoder with the batch format the
Energon loader picks.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.settings import BenchSettings

_LAYOUT_VERSION = 1
PROCESSOR_FACTORY = "rl_data.energon.multimodal.task_encoders.processor:load_default_multimodal_processor"
IMAGE_MEMBER = "image.jpg"
#: Batch keys that hold media tensors (one PackedTensor row per batch row).
MEDIA_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "input_features", "audio_feature_lengths")


@dataclass(frozen=True)
class VlmWorkload:
    """Where the VLM workload lives and how it was made."""

    energon_path: str
    jsonl_paths: tuple[str, ...]
    images_dir: str
    num_samples: int
    image_size: int
    mean_jpeg_bytes: float

    def describe(self) -> dict[str, Any]:
        return {
            "num_samples": self.num_samples,
            "images_per_sample": 1,
            "image_size": [self.image_size, self.image_size],
            "mean_jpeg_bytes": round(self.mean_jpeg_bytes),
            "energon_shards": len(self.jsonl_paths),
            "generator": "photo-like JPEG (smooth colour field + texture + noise + one shape) and a question about it",
        }


def sample_key(row: int) -> str:
    return f"vlm-{row:06d}"


def photo_jpeg(row: int, size: int, seed: int) -> bytes:
    """Row ``row``'s deterministic photo-like JPEG (see the module docstring)."""
    from PIL import Image

    from rl_data.demo_data import SHAPES, COLORS, shape_picture

    rng = np.random.default_rng([seed, row])
    field = Image.fromarray(rng.integers(0, 256, (5, 5, 3), dtype=np.uint8)).resize((size, size), Image.BICUBIC)
    texture = Image.fromarray(rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)).resize((size, size), Image.BILINEAR)
    background = Image.blend(field, texture, 0.25)
    shape = shape_picture(SHAPES[row % len(SHAPES)], list(COLORS)[row // len(SHAPES) % len(COLORS)], (size, size), seed=row)
    mask = shape.convert("L").point(lambda v: 255 if v < 250 else 0)
    picture = Image.composite(Image.blend(background, shape, 0.85), background, mask)
    noise = _noise_tile(size, seed)
    dy, dx = (int(v) for v in rng.integers(0, size, 2))
    pixels = np.asarray(picture, dtype=np.int16) + np.roll(noise, (dy, dx), axis=(0, 1))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


@functools.lru_cache(maxsize=2)
def _noise_tile(size: int, seed: int) -> np.ndarray:
    """Sensor-like noise (sigma 6), drawn once and shifted per picture (drawing it per picture doubled the cost)."""
    return np.rint(6.0 * np.random.default_rng(seed).standard_normal((size, size, 3))).astype(np.int16)


def sample_record(row: int) -> dict[str, Any]:
    """The canonical ``sft`` record of row ``row`` (its image is the member ``image.jpg``)."""
    from rl_data.demo_data import COLORS, QUESTIONS, SHAPES

    shape, color = SHAPES[row % len(SHAPES)], list(COLORS)[row // len(SHAPES) % len(COLORS)]
    question, answer = QUESTIONS[row // (len(SHAPES) * len(COLORS)) % 2]  # the third says "white background"
    return {
        "kind": "sft",
        "messages": [
            {"role": "user", "content": [{"type": "image", "image": IMAGE_MEMBER}, {"type": "text", "text": question}]},
            {"role": "assistant", "content": answer.format(color=color, shape=shape)},
        ],
        "source": {"file": "vlm-photos", "row": row},
    }


def prepare_vlm_workload(settings: BenchSettings, cache_dir: str | Path) -> VlmWorkload:
    """Write (or reuse) the VLM workload for ``settings`` under ``cache_dir``."""
    recipe = {
        "version": _LAYOUT_VERSION,
        "num_samples": settings.vlm_samples,
        "image_size": settings.vlm_image_size,
        "samples_per_shard": settings.vlm_samples_per_shard,
        "seed": settings.seed,
    }
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    root = Path(cache_dir) / f"vlm-{digest}"
    done = root / "workload.json"
    if not done.exists():
        mean_bytes = _write(root, settings)
        done.write_text(json.dumps({**recipe, "mean_jpeg_bytes": mean_bytes}))
    mean_bytes = json.loads(done.read_text())["mean_jpeg_bytes"]
    jsonl_paths = tuple(sorted(str(p) for p in (root / "jsonl").glob("*.jsonl")))
    return VlmWorkload(
        str(root / "energon"), jsonl_paths, str(root / "images"), settings.vlm_samples, settings.vlm_image_size, mean_bytes
    )


def _write(root: Path, settings: BenchSettings) -> float:
    from rl_data.energon.dataset_writer import write_energon_dataset
    from rl_data.energon.sample_format import encode_sample

    images, jsonl = root / "images", root / "jsonl"
    images.mkdir(parents=True, exist_ok=True)
    jsonl.mkdir(parents=True, exist_ok=True)
    samples, total = [], 0
    for row in range(settings.vlm_samples):
        jpeg = photo_jpeg(row, settings.vlm_image_size, settings.seed)
        total += len(jpeg)
        (images / f"{sample_key(row)}.jpg").write_bytes(jpeg)
        samples.append((sample_key(row), encode_sample(sample_record(row), {IMAGE_MEMBER: jpeg})))
    per_shard = settings.vlm_samples_per_shard
    write_energon_dataset(root / "energon", samples, samples_per_shard=per_shard, splits={"train": 1.0})
    for shard, start in enumerate(range(0, len(samples), per_shard)):
        lines = [members["json"] + b"\n" for _, members in samples[start : start + per_shard]]
        (jsonl / f"part-{shard:05d}.jsonl").write_bytes(b"".join(lines))
    return total / max(1, len(samples))


def energon_block(settings: BenchSettings, workers: int) -> dict[str, Any]:
    """``data_config["energon"]`` of the VLM rank actors."""
    return {"task": "vlm_sft", "num_workers": workers, "shuffle_buffer_size": 100, "max_samples_per_sequence": 100}


def loader_kwargs(workload: VlmWorkload, settings: BenchSettings, *, workers: int) -> dict[str, Any]:
    """``LoaderSpec`` arguments of the VLM rank actors (no topology; unpacked)."""
    from benchmarks.energon_bare import VIRTUAL_EPOCH_BATCHES

    return dict(
        data_config={"energon": energon_block(settings, workers), "shuffle": True},
        source={"path": workload.energon_path, "split": "train", "virtual_epoch_length": VIRTUAL_EPOCH_BATCHES},
        processor_factory=PROCESSOR_FACTORY,
        batch_size=settings.vlm_batch_size,
        max_sequence_length=settings.vlm_max_sequence_length,
        split_role="train",
        packing_algorithm=None,
        max_sequences_per_bin=None,
        sequence_length_pad_multiple=settings.sequence_length_pad_multiple,
        only_unmask_final=False,
    )


def vlm_training_batch(batch: Any, adapter: Any, pad_multiple: int) -> dict[str, Any]:
    """A ``vlm_sft`` batch -> the common training batch plus its media tensors (idempotent).

    The text goes through :func:`benchmarks.encoding.training_batch` with the per-message media
    dropped from the message logs (the batch carries them once more, per row, and a trainer
    feeds those); ``pixel_values`` / ``image_grid_thw`` stay as the batch's ``PackedTensor``s.
    """
    from benchmarks.encoding import training_batch
    from rl_data.packed_tensor import PackedTensor

    if "num_images" in batch:
        return batch
    text = {k: v for k, v in batch.items() if k not in MEDIA_KEYS}
    if "message_log" in text:
        text["message_log"] = [
            [{k: v for k, v in m.items() if not isinstance(v, PackedTensor)} for m in log] for log in text["message_log"]
        ]
    out = dict(training_batch(text, adapter, pad_multiple))
    grids = batch["image_grid_thw"]
    out["num_images"] = sum(int(t.shape[0]) for t in grids.tensors if t is not None)
    out["pixel_values"] = batch["pixel_values"]
    out["image_grid_thw"] = grids
    return out


def touch_media(step: Any) -> Any:
    """Read every pixel tensor of a step once (as a trainer copying them to the GPU would); return the step."""
    batches = step.get("batches", [step])
    for batch in batches:
        for tensor in batch["pixel_values"].tensors:
            if tensor is not None:
                tensor.sum()
    return step


class VlmSampleEncoder:
    """The rank actors' per-sample work outside Energon: ``vlm_sft``'s cooker and encoder on the same bytes."""

    def __init__(self, settings: BenchSettings) -> None:
        from rl_data.energon.config import validate_data_config
        from rl_data.energon.multimodal.task_encoders.processor import load_default_multimodal_processor
        from rl_data.energon.multimodal.task_encoders.vlm_sft import MultimodalChatCooker, VLMSFTTaskEncoder
        from rl_data.energon.task_encoders.adapter import ProcessorAdapter
        from rl_data.task_registry import get_task

        task = get_task("vlm_sft")
        data_config = validate_data_config({"energon": energon_block(settings, 0), "shuffle": True})
        processor = load_default_multimodal_processor()
        length = settings.vlm_max_sequence_length
        self.adapter = ProcessorAdapter.from_processor(processor, {**data_config.adapter_flags(), **task.adapter_overrides}, length)
        # the batch form the loader picks (padded tensors where the encoder can make them)
        batch_format = data_config.batch_format or ("tensors" if getattr(VLMSFTTaskEncoder, "TENSOR_BATCHES", False) else "message_log")
        self.encoder = VLMSFTTaskEncoder(
            processor=processor,
            adapter=self.adapter,
            max_sequence_length=length,
            include_source_ids=True,
            sequence_length_pad_multiple=settings.sequence_length_pad_multiple,
            tokenizer=self.adapter.tokenizer,
            batch_format=batch_format,
        )
        self.cook = MultimodalChatCooker.cook
        self.pad_multiple = settings.sequence_length_pad_multiple

    def encode(self, key: str, line: bytes, image: bytes) -> Any:
        """One sample: cook (JSON decode, member and message checks) and encode (image + text)."""
        raw = {"__key__": key, "__restore_key__": (), "__subflavors__": {}, "__sources__": (), "json": line, IMAGE_MEMBER: image}
        return self.encoder.encode_sample(self.cook(raw))

    def collate(self, samples: list[Any]) -> dict[str, Any]:
        """The encoder's batch, turned into the common training batch."""
        return vlm_training_batch(self.encoder.batch(samples), self.adapter, self.pad_multiple)
