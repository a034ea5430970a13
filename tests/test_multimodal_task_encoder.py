"""Multimodal SFT: media members -> Energon dataset -> VLMSFTTaskEncoder -> batch.

Media are generated here (PIL images, WAV via ``wave``, FLAC and MP4 via PyAV); every media
tensor is compared with the image processor / feature extractor called directly on the same
decoded inputs.
"""

from __future__ import annotations

import io
import json
import logging
from functools import partial

import numpy as np
import pytest
import torch
from PIL import Image

from multimodal_fixtures import (
    flac_bytes,
    image_bytes,
    mp4_bytes,
    sft_record,
    tone,
    user_turn,
    wav_bytes,
    write_raw_dataset,
)
from energon_fixtures import make_loader
from restore_check import assert_restores_at_every_step
from rl_data.energon.multimodal.task_encoders import (
    MediaSettings,
    MultimodalProcessor,
    VLMSFTTaskEncoder,
    build_multimodal_processor,
)
from rl_data.energon.multimodal.task_encoders.media import check_media_decodable, decode_video, sample_frame_indices
from rl_data.energon.multimodal.task_encoders.vlm_sft import expand_media
from rl_data.energon.sample_format import encode_sample, media_references
from rl_data.energon.task_encoders import ProcessorAdapter
from rl_data.task_registry import get_task
from rl_data.interfaces import TaskDataSpec
from rl_data.packed_tensor import PackedTensor
from rl_data.tokenization.vision_tokens import with_media_tokens

MAX_LEN = 256
NUM_FRAMES = 2
ANSWER = {"role": "assistant", "content": "I see it."}


def _media_kinds(row: int) -> tuple[list[dict], dict[str, bytes]]:
    """The messages and media members of generated sample ``row`` (7 kinds, cycling)."""
    kind = row % 7
    if kind == 0:
        return [user_turn("What is this?", {"type": "image", "image": "photo.jpg"}), ANSWER], {
            "photo.jpg": image_bytes(56, 56, row)
        }
    if kind == 1:  # two images in two turns, PNG and WEBP, different sizes
        messages = [
            user_turn({"type": "image", "image": "first.png"}, "and"),
            ANSWER,
            user_turn({"type": "image", "image": "second.webp"}),
            ANSWER,
        ]
        return messages, {"first.png": image_bytes(56, 56, row, "PNG"), "second.webp": image_bytes(84, 56, row, "WEBP")}
    if kind == 2:  # frame sequence of 4 frames
        frames = [f"clip-f{i}.jpg" for i in range(4)]
        return [user_turn({"type": "video", "video": frames}, "Describe."), ANSWER], {
            name: image_bytes(56, 56, row * 10 + i) for i, name in enumerate(frames)
        }
    if kind == 3:
        return [user_turn({"type": "video", "video": "clip.mp4"}), ANSWER], {"clip.mp4": mp4_bytes(5, 56, 56, row)}
    if kind == 4:
        return [user_turn("Listen:", {"type": "audio", "audio": "speech.wav"}), ANSWER], {
            "speech.wav": wav_bytes(tone(1650, row))
        }
    if kind == 5:
        return [user_turn({"type": "audio", "audio": "speech.flac"}), ANSWER], {"speech.flac": flac_bytes(tone(3200, row))}
    return [{"role": "user", "content": "Just text."}, ANSWER], {}


def _samples(count: int) -> tuple[list[tuple[str, dict]], dict[str, tuple[dict, dict]]]:
    samples, records = [], {}
    for row in range(count):
        messages, media = _media_kinds(row)
        key = f"mm-{row:03d}-k{row % 7}"
        record = sft_record(messages, row)
        samples.append((key, encode_sample(record, media)))
        records[key] = (record, media)
    return samples, records


@pytest.fixture(scope="module")
def processor(tokenizer):
    return build_multimodal_processor(
        tokenizer, task_data_spec=TaskDataSpec(num_frames=NUM_FRAMES, pad_audio_to_hop_length=True)
    )


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """28 samples in 7 shards of 4: train 20, val 8 (every kind at least once in val)."""
    root = tmp_path_factory.mktemp("multimodal")
    samples, records = _samples(28)
    split_keys = write_raw_dataset(root, samples, samples_per_shard=4, splits={"train": 5, "val": 2})
    return root, split_keys, records


#: The shared loader builder with this module's defaults: the vlm_sft task, the val split read
#: in order (role "validation"), batches of 2, loops of 3 batches (role "train").
vlm_loader = partial(make_loader, energon={"task": "vlm_sft"}, source={"virtual_epoch_length": 3}, role="validation",
                     batch_size=2, max_sequence_length=MAX_LEN)
MESSAGE_LOGS = {"batch_format": "message_log"}


# -- expected tensors: the processor parts called directly --------------------------------


def _pil(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def _mp4_frames(data: bytes) -> list[Image.Image]:
    import av

    with av.open(io.BytesIO(data)) as container:
        return [frame.to_image() for frame in container.decode(video=0)]


def _pcm(data: bytes) -> np.ndarray:
    """Samples of a 16-bit WAV (header skipped) or FLAC, as float32 / 32768."""
    import av

    with av.open(io.BytesIO(data)) as container:
        frames = [f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]
    return np.concatenate(frames).astype(np.float32) / 32768


def expected_media(record: dict, media: dict[str, bytes], processor: MultimodalProcessor) -> dict[str, torch.Tensor]:
    images, grids, videos, video_grids, features = [], [], [], [], []
    image_processor, extractor = processor.image_processor, processor.feature_extractor
    for message in record["messages"]:
        for part in message["content"] if isinstance(message["content"], list) else []:
            if part["type"] == "image":
                out = image_processor(images=[_pil(media[part["image"]])], return_tensors="pt")
                images.append(out["pixel_values"])
                grids.append(out["image_grid_thw"])
            elif part["type"] == "video":
                ref = part["video"]
                frames = _mp4_frames(media[ref]) if isinstance(ref, str) else [_pil(media[f]) for f in ref]
                picked = [frames[0], frames[-1]]  # NUM_FRAMES = 2: first and last
                out = image_processor(images=picked, return_tensors="pt")
                videos.append(out["pixel_values"])
                video_grids.append(torch.tensor([[2, *out["image_grid_thw"][0, 1:].tolist()]]))
            elif part["type"] == "audio":
                waveform = _pcm(media[part["audio"]])
                padded = np.pad(waveform, (0, -len(waveform) % 160))
                out = extractor(padded, sampling_rate=16000, return_tensors="pt", padding="longest")
                features.append(out["input_features"][0])
    cat = lambda parts, dim=0: torch.cat(parts, dim) if parts else None  # noqa: E731
    return {
        "pixel_values": cat(images),
        "image_grid_thw": cat(grids),
        "pixel_values_videos": cat(videos),
        "video_grid_thw": cat(video_grids),
        "input_features": cat(features, 1),
        "audio_feature_lengths": cat([torch.tensor([f.shape[1]]) for f in features]),
    }


def _count(ids: torch.Tensor, processor, token: str) -> int:
    return int((ids == processor.media_token_ids[token]).sum())


def _assert_rows_equal(found: PackedTensor, expected: list, key: str) -> None:
    assert len(found) == len(expected), key
    for row, (got, want) in enumerate(zip(found.tensors, expected)):
        if want is None:
            assert got is None, f"{key} row {row}: expected None, found {tuple(got.shape)}"
        else:
            assert got is not None and got.dtype == want.dtype and torch.equal(got, want), f"{key} row {row} differs"


# -- end to end ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_image_video_and_audio_samples_end_to_end(dataset, processor):
    root, split_keys, records = dataset
    batches = list(vlm_loader(root, processor))
    keys = [k for b in batches for k in b["source_ids"]]
    assert keys == split_keys["val"]
    assert {k.rsplit("-", 1)[1] for k in keys} == {f"k{i}" for i in range(7)}
    for batch in batches:
        multimodal = batch.get_multimodal_dict()
        assert sorted(multimodal) == sorted(processor.media_keys)
        expected = [expected_media(*records[k], processor) for k in batch["source_ids"]]
        for key in processor.media_keys:
            _assert_rows_equal(multimodal[key], [e[key] for e in expected], key)
        for row, want in enumerate(expected):
            ids = batch["input_ids"][row, : batch["input_lengths"][row]]
            grids = {g: want[g] for g in ("image_grid_thw", "video_grid_thw")}
            image_tokens = 0 if grids["image_grid_thw"] is None else int(grids["image_grid_thw"].prod(1).sum()) // 4
            video_tokens = 0 if grids["video_grid_thw"] is None else int(grids["video_grid_thw"].prod(1).sum()) // 4
            audio_frames = [] if want["audio_feature_lengths"] is None else want["audio_feature_lengths"].tolist()
            assert _count(ids, processor, "<|image_pad|>") == image_tokens
            assert _count(ids, processor, "<|video_pad|>") == video_tokens
            assert _count(ids, processor, "<|audio_pad|>") == sum((f - 1) // 2 + 1 for f in audio_frames)
    assert torch.equal(batches[0]["loss_multiplier"], torch.ones(2))


@pytest.mark.timeout(120)
def test_large_images_from_energon_workers_arrive_whole_through_shared_memory(tmp_path, processor):
    # 224 x 280 pixels: 320 patches of 1,176 float32 = 1.5 MB, over worker_items.INLINE_MAX_BYTES (not in the message)
    samples, records = [], {}
    for row in range(8):
        parts = [{"type": "image", "image": f"{i}.jpg"} for i in range(1 + row % 2)]  # two in one turn: joined
        record = sft_record([user_turn("What are these?", *parts), ANSWER], row)
        media = {f"{i}.jpg": image_bytes(280, 224, row * 10 + i) for i in range(1 + row % 2)}
        samples.append((f"big-{row}", encode_sample(record, media)))
        records[f"big-{row}"] = (record, media)
    write_raw_dataset(tmp_path, samples, samples_per_shard=2, splits={"train": 1})
    # a training loader: its workers send their checkpoints with their items (rl_data.energon.worker_items)
    loader = vlm_loader(tmp_path, processor, role="train", workers=2, data_config=MESSAGE_LOGS)
    try:
        batches = list(loader)  # a virtual epoch of 3 batches
    finally:
        loader.close()
    keys = [k for b in batches for k in b["source_ids"]]
    assert len(batches) == 3 and len(set(keys)) == len(keys) and set(keys) <= set(records)
    for batch in batches:
        rows = batch["pixel_values"].tensors
        expected = [expected_media(*records[k], processor)["pixel_values"] for k in batch["source_ids"]]
        _assert_rows_equal(batch["pixel_values"], expected, "pixel_values")
        assert all(row.is_shared() for row in rows)
        for row, log in zip(rows, batch["message_log"]):
            assert log[0]["pixel_values"].tensors[0] is row  # the message's media is the batch row


def test_one_image_keeps_the_processors_tensor_and_two_in_a_message_are_joined(processor, monkeypatch):
    made = []

    def process_image(image):  # the processor's output, kept to compare with what the message holds
        made.append(torch.rand(16, 1176))
        return {"pixel_values": made[-1], "image_grid_thw": torch.tensor([[1, 4, 4]])}

    monkeypatch.setattr(processor, "process_image", process_image)
    media = {"a.jpg": image_bytes(56, 56, 0), "b.jpg": image_bytes(56, 56, 1)}
    parts = [{"type": "image", "image": name} for name in media]
    _, (single,) = expand_media([user_turn("What?", parts[0])], media, processor)
    assert single["pixel_values"].tensors[0] is made[0]  # not copied (4.8 MB for a 448 x 448 image)
    _, (joined,) = expand_media([user_turn("What?", *parts)], media, processor)
    assert torch.equal(joined["pixel_values"].tensors[0], torch.cat(made[1:]))  # both, in order, one tensor


def test_media_tensors_sit_on_the_message_that_references_them(dataset, processor):
    root, split_keys, records = dataset
    key = next(k for k in split_keys["val"] if k.endswith("k1"))  # two images in two user turns
    batch = next(b for b in vlm_loader(root, processor, data_config=MESSAGE_LOGS) if key in b["source_ids"])
    log = batch["message_log"][batch["source_ids"].index(key)]
    assert [m["role"] for m in log] == ["user", "assistant", "user", "assistant"]
    assert [tuple(m["image_grid_thw"].as_tensor()[0].tolist()) for m in (log[0], log[2])] == [(1, 4, 4), (1, 4, 6)]
    assert all(isinstance(m["pixel_values"], PackedTensor) and len(m["pixel_values"]) == 1 for m in (log[0], log[2]))
    assert "pixel_values" not in log[1] and "pixel_values" not in log[3]
    assert _count(log[2]["token_ids"], processor, "<|image_pad|>") == 6


def test_frames_are_picked_uniformly():
    assert sample_frame_indices(5, 2) == [0, 4]
    assert sample_frame_indices(9, 3) == [0, 4, 8]
    assert sample_frame_indices(10, 4) == [0, 3, 6, 9]
    assert sample_frame_indices(3, 8) == [0, 1, 2]
    assert sample_frame_indices(3, None) == [0, 1, 2]
    frames = {f"f{i}.png": image_bytes(28, 28, i, "PNG") for i in range(3)}
    picked = decode_video(frames, ["f0.png", "f1.png", "f2.png"], 2)
    assert [np.asarray(p).tobytes() for p in picked] == [np.asarray(_pil(frames[n])).tobytes() for n in ("f0.png", "f2.png")]


# -- direct encoder runs: settings, truncation, errors -------------------------------------


def _encoder(processor, max_len=MAX_LEN, **options):
    adapter = ProcessorAdapter.from_processor(processor, {}, max_len)
    return VLMSFTTaskEncoder(processor=processor, adapter=adapter, max_sequence_length=max_len, **options)


def _encode(encoder, messages, media):
    members = encode_sample(sft_record(messages, 0), media)
    raw = {"__key__": "k", "__restore_key__": ("Test", 0), "__sources__": (), **members}
    return encoder.encode_sample(encoder.cookers[0].cook(raw))


def test_default_audio_features_cover_thirty_seconds(tokenizer):
    processor = build_multimodal_processor(tokenizer, images=False)
    encoded = _encode(_encoder(processor, 2048), [user_turn({"type": "audio", "audio": "a.wav"}), ANSWER], {"a.wav": wav_bytes(tone(1650, 0))})
    user = encoded.message_log[0]
    assert user["input_features"].as_tensor().shape == (80, 3000)
    assert user["audio_feature_lengths"].as_tensor().tolist() == [3000]
    assert _count(user["token_ids"], processor, "<|audio_pad|>") == 1500
    assert encoded.loss_multiplier == 1.0


def test_image_max_num_tiles_caps_the_image_tokens(tokenizer):
    processor = build_multimodal_processor(tokenizer, task_data_spec=TaskDataSpec(image_max_num_tiles=16), audio=False)
    data = image_bytes(224, 224, 3)
    user = _encode(_encoder(processor), [user_turn({"type": "image", "image": "big.jpg"}), ANSWER], {"big.jpg": data}).message_log[0]
    direct = processor.image_processor(
        images=[_pil(data)], size={"shortest_edge": 3136, "longest_edge": 16 * 28 * 28}, return_tensors="pt"
    )
    assert user["image_grid_thw"].as_tensor().tolist() == [[1, 8, 8]] == direct["image_grid_thw"].tolist()
    assert torch.equal(user["pixel_values"].as_tensor(), direct["pixel_values"])
    assert _count(user["token_ids"], processor, "<|image_pad|>") == 16


def test_unsupported_task_data_spec_fields_are_refused():
    with pytest.raises(ValueError, match=r"TaskDataSpec.video_target_num_patches=64 is not supported"):
        MediaSettings.from_task_data_spec(TaskDataSpec(video_target_num_patches=64))
    assert MediaSettings.from_task_data_spec(TaskDataSpec(num_frames=3)).num_frames == 3


def test_a_cut_sample_loses_its_media_and_its_loss(processor):
    encoder = _encoder(processor, max_len=16)
    encoded = _encode(encoder, [user_turn("Look", {"type": "image", "image": "p.jpg"}), ANSWER], {"p.jpg": image_bytes(56, 56, 0)})
    assert encoded.loss_multiplier == 0.0
    user = encoded.message_log[0]
    assert user["pixel_values"].as_tensor().shape == (0, 1176)
    assert user["image_grid_thw"].as_tensor().shape == (0, 3)
    assert user["token_ids"].tolist() == [151644, 872, 198, 10380]  # <|im_start|> user \n Look
    assert encoded.length == 8
    batch = encoder.batch([encoded])
    assert batch.get_multimodal_dict(as_tensors=True)["pixel_values"].shape == (0, 1176)


def test_media_tokens_left_in_a_cut_sample_become_padding(processor):
    encoder = _encoder(processor, max_len=8)
    encoded = _encode(encoder, [user_turn({"type": "image", "image": "p.jpg"}), ANSWER], {"p.jpg": image_bytes(56, 56, 0)})
    pad = processor.tokenizer.pad_token_id
    assert encoded.message_log[0]["token_ids"].tolist() == [151644, 872, 198, pad]  # was <|vision_start|>


def test_a_text_only_tokenizer_is_refused(tokenizer, dataset):
    root, _, _ = dataset
    with pytest.raises(ValueError, match=r"needs a MultimodalProcessor, got TokenizersBackend \(a text-only tokenizer"):
        vlm_loader(root, tokenizer)
    with pytest.raises(ValueError, match=r"is text-only: it has no media placeholder tokens \['<\|audio_start\|>'"):
        MultimodalProcessor(tokenizer, image_processor=object())


def test_with_media_tokens_copies_and_keeps_every_existing_id(tokenizer):
    extended = with_media_tokens(tokenizer)
    assert len(tokenizer) == 151669 and len(extended) == 151672
    assert [extended.convert_tokens_to_ids(t) for t in ("<|audio_start|>", "<|audio_end|>", "<|audio_pad|>")] == [151669, 151670, 151671]
    assert extended.convert_tokens_to_ids("<|image_pad|>") == tokenizer.convert_tokens_to_ids("<|image_pad|>") == 151655
    text = "<|im_start|>user\nHello assistant<|im_end|>"
    assert extended(text)["input_ids"] == tokenizer(text)["input_ids"] == [151644, 872, 198, 9707, 17847, 151645]


def test_identity_pins_the_media_processor(dataset, processor, tokenizer):
    root, _, _ = dataset
    loader = vlm_loader(root, processor)
    assert loader.identity["components"] == {
        "VLMSFTTaskEncoder": 1,
        "MultimodalChatCooker": 1,
        "media_processor": processor.fingerprint,
    }
    other = MultimodalProcessor(
        processor.tokenizer,
        image_processor=processor.image_processor,
        feature_extractor=processor.feature_extractor,
        settings=MediaSettings(num_frames=4, pad_audio_to_hop_length=True),
    )
    with pytest.raises(ValueError, match=r"^Energon loader identity changed: components.media_processor '"):
        vlm_loader(root, other).load_state_dict(loader.state_dict())
    assert get_task("vlm_sft").encoder_class is VLMSFTTaskEncoder


# -- restore, packing ----------------------------------------------------------------------


def media_view(batch):
    """Ids and tensors of an unpacked or packed multimodal batch (media rows flattened)."""
    if "message_log" in batch:
        ids = list(batch["source_ids"])
        tensors = {"tokens": torch.cat([m["token_ids"] for log in batch["message_log"] for m in log])}
    else:
        packed = "cu_seqlens" in batch
        ids = [i for pack in batch["source_ids"] for i in pack] if packed else list(batch["source_ids"])
        tensors = {"input_ids": batch["input_ids"], "token_mask": batch["token_mask"]}
    for key, packed in batch.get_multimodal_dict().items():
        rows = [t.flatten().to(torch.float64) for t in packed.tensors if t is not None]
        tensors[key] = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.float64)
        tensors[f"{key}_rows"] = torch.tensor([-1 if t is None else t.numel() for t in packed.tensors])
    return ids, tensors


@pytest.mark.timeout(120)
@pytest.mark.parametrize("packing", [False, True], ids=["unpacked", "packed"])
def test_restore_at_every_step(dataset, processor, packing):
    root, split_keys, _ = dataset
    options = {"packing_buffer": 4} if packing else {}
    report = assert_restores_at_every_step(
        lambda: vlm_loader(root, processor, role="train", **options), steps=4, extract=media_view
    )
    assert set(report.ids) <= set(split_keys["train"])
    assert report.epoch_starts == [3]


@pytest.mark.timeout(120)
def test_packing_keeps_every_source_with_its_media(dataset, processor):
    root, split_keys, records = dataset
    loader = vlm_loader(root, processor, packing_buffer=8, batch_size=1)
    seen, multi_source_packs = [], 0
    for batch in loader:
        (sources,) = batch["source_ids"]
        seen.extend(sources)
        multi_source_packs += len(sources) > 1
        multimodal = batch.get_multimodal_dict()
        cu = batch["cu_seqlens_padded"].tensors[0].tolist()
        ids = batch["input_ids"][0]
        expected = [expected_media(*records[k], processor) for k in sources]
        for key in processor.media_keys:  # the pack's row: its sources' media, source after source
            parts = [e[key] for e in expected if e[key] is not None]
            want = torch.cat(parts, processor.media_keys[key]) if parts else None
            _assert_rows_equal(multimodal[key], [want], key)
        for i, want in enumerate(expected):  # each source's placeholders sit in its own segment
            segment = ids[cu[i] : cu[i + 1]]
            grid = want["image_grid_thw"]
            assert _count(segment, processor, "<|image_pad|>") == (0 if grid is None else int(grid.prod(1).sum()) // 4)
    assert sorted(seen) == sorted(split_keys["val"])
    assert multi_source_packs >= 1


# -- bad media -------------------------------------------------------------------------------


def _unchecked_members(record: dict, media: dict[str, bytes]) -> dict[str, bytes]:
    """Tar members written without the one-to-one media check (as a broken writer would)."""
    return {"json": json.dumps(record).encode(), **media}


def test_corrupt_media_is_skipped_logged_and_counted(tmp_path, processor, caplog):
    good, _ = _samples(6)
    photo = image_bytes(56, 56, 1)
    image_turn = [user_turn({"type": "image", "image": "photo.jpg"}), ANSWER]
    bad = [
        ("bad-truncated-jpg", encode_sample(sft_record(image_turn, 90), {"photo.jpg": photo[: len(photo) // 2]})),
        ("bad-missing-member", _unchecked_members(sft_record(image_turn, 91), {})),
        ("bad-unreferenced-member", _unchecked_members(sft_record([ANSWER], 92), {"extra.jpg": photo})),
    ]
    samples = good[:2] + bad[:1] + good[2:4] + bad[1:] + good[4:]
    split_keys = write_raw_dataset(tmp_path, samples, samples_per_shard=3, splits={"train": 1})
    caplog.set_level(logging.WARNING, logger="rl_data.energon.failure_budget")
    loader = vlm_loader(tmp_path, processor, source={"split": "train", "virtual_epoch_length": 0})
    keys = [k for batch in loader for k in batch["source_ids"]]
    assert keys == [k for k in split_keys["train"] if not k.startswith("bad-")]
    assert loader.skipped_samples == 3
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped sample: ")]
    prefix = f"skipped sample: dataset={tmp_path} shard=shards/shard-"
    assert len(lines) == 3
    assert lines[0].startswith(f"{prefix}000000.tar index=2 key=bad-truncated-jpg: ValueError: image member 'photo.jpg' cannot be decoded (")
    assert lines[1] == (
        f"{prefix}000001.tar index=5 key=bad-missing-member: ValueError: image member 'photo.jpg' is "
        "referenced but missing (sample members: [])"
    )
    assert lines[2] == (
        f"{prefix}000002.tar index=6 key=bad-unreferenced-member: ValueError: media members "
        "['extra.jpg'] are not referenced by any content part; remove them"
    )


def test_a_modality_the_processor_lacks_is_a_clear_per_sample_error(tokenizer):
    processor = build_multimodal_processor(tokenizer, audio=False)
    with pytest.raises(ValueError, match=r"^message 0 has a media part of type 'audio' but the processor has no feature extractor \(it encodes \['image', 'video'\]\)"):
        _encode(_encoder(processor), [user_turn({"type": "audio", "audio": "a.wav"}), ANSWER], {"a.wav": wav_bytes(tone(160, 0))})


# -- the sample format -----------------------------------------------------------------------


def test_encode_sample_checks_media_members_one_to_one():
    record = sft_record([user_turn({"type": "image", "image": "a.jpg"}, {"type": "video", "video": ["f0.jpg", "f1.png"]}), ANSWER], 0)
    assert media_references(record) == [("image", "a.jpg"), ("video_frame", "f0.jpg"), ("video_frame", "f1.png")]
    media = {"a.jpg": b"1", "f0.jpg": b"2", "f1.png": b"3"}
    assert encode_sample(record, media).keys() == {"json", "a.jpg", "f0.jpg", "f1.png"}
    cases = [
        ({"a.jpg": b"1", "f0.jpg": b"2"}, r"video_frame member 'f1.png' is referenced but missing"),
        ({**media, "b.wav": b"4"}, r"media members \['b.wav'\] are not referenced"),
        ({**media, "bad.name.jpg": b"4"}, r"media member name 'bad.name.jpg' is invalid"),
    ]
    for members, message in cases:
        with pytest.raises(ValueError, match=message):
            encode_sample(record, members)
    twice = sft_record([user_turn({"type": "image", "image": "a.jpg"}, {"type": "image", "image": "a.jpg"}), ANSWER], 0)
    with pytest.raises(ValueError, match=r"media member 'a.jpg' is referenced more than once"):
        encode_sample(twice, {"a.jpg": b"1"})
    wrong = sft_record([user_turn({"type": "audio", "audio": "a.jpg"}), ANSWER], 0)
    with pytest.raises(ValueError, match=r"audio member 'a.jpg' has extension not in \('wav', 'flac'\)"):
        encode_sample(wrong, {"a.jpg": b"1"})


def test_check_media_decodable_names_the_first_bad_member():
    messages, media = _media_kinds(1)  # PNG + WEBP
    record = sft_record(messages, 0)
    check_media_decodable(record, media)
    for kind in (2, 3, 4, 5):  # frames, mp4, wav, flac
        kind_messages, kind_media = _media_kinds(kind)
        check_media_decodable(sft_record(kind_messages, 0), kind_media)
    broken = {**media, "second.webp": media["second.webp"][:40]}
    with pytest.raises(ValueError, match=r"^image member 'second.webp' cannot be decoded \(40 bytes\)"):
        check_media_decodable(record, broken)
    messages, media = _media_kinds(3)
    with pytest.raises(ValueError, match=r"^video member 'clip.mp4' cannot be decoded \(100 bytes\)"):
        check_media_decodable(sft_record(messages, 0), {"clip.mp4": media["clip.mp4"][:100]})
    messages, media = _media_kinds(4)
    with pytest.raises(ValueError, match=r"^audio member 'speech.wav' is not a readable WAV file"):
        check_media_decodable(sft_record(messages, 0), {"speech.wav": b"RIFF0000"})
