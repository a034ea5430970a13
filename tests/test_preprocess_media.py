"""Rows with images, videos and audio through the preprocessing job and back through the loader.

Media are generated into real files (PIL images, WAV via ``wave``, FLAC and MP4 via PyAV); the
job runs on real Ray; the dataset is read with ``build_energon_sft_loader`` and the ``vlm_sft``
encoder, and every media tensor is compared with the processor parts called directly on the
input files.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
import wave

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from multimodal_fixtures import flac_bytes, image_bytes, mp4_bytes, tone, user_turn, wav_bytes
from PIL import Image
from preprocess_fixtures import read_quarantine

from rl_data.energon.multimodal.task_encoders import build_multimodal_processor
from rl_data.energon.sft_dataloader import build_energon_sft_loader
from rl_data.interfaces import TaskDataSpec
from rl_data.preprocess.pipeline import PreprocessConfig, run_preprocess
from rl_data.preprocess.adapters import sharegpt
from rl_data.preprocess.media import resolve_media, sniff_extension
from rl_data.preprocess.pipeline import load_dataset_info
from rl_data.preprocess.transform import OUTPUT_SCHEMA, sample_key
from rl_data.preprocess.validation import RowRejected
from rl_data.preprocess.writer import DatasetWriter

ANSWER = {"role": "assistant", "content": "I see it."}
FRAMES = [f"media/frames/f{i}.jpg" for i in range(4)]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def media_input(tmp_path_factory):
    """``rows.jsonl`` (7 good rows, 5 bad) and ``more.parquet`` (1 good row) with their media files.

    Returns the folder, ``{key: [(part type, [file bytes, ...]), ...]}`` for the good rows, and
    ``{(file, row): reason}`` for the bad ones.
    """
    folder = tmp_path_factory.mktemp("media_input")
    files = {
        "media/cat.jpg": image_bytes(32, 32, 1),
        "media/dog.png": image_bytes(32, 32, 2, "PNG"),
        "media/clip.mp4": mp4_bytes(5, 32, 32, 3),
        "media/speech.wav": wav_bytes(tone(1650, 4)),
        "media/broken.jpg": image_bytes(32, 32, 5)[:200],
        **{frame: image_bytes(32, 32, 10 + i) for i, frame in enumerate(FRAMES)},
    }
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    webp, flac = image_bytes(32, 32, 6, "WEBP"), flac_bytes(tone(3200, 7))
    rows = [
        [user_turn("What is this?", {"type": "image", "image": "media/cat.jpg"}), ANSWER],
        [user_turn({"type": "image", "image": str(folder / "media/dog.png")}), ANSWER,
         user_turn("And this?", {"type": "image", "image_bytes": b64(webp)}), ANSWER],
        [user_turn({"type": "video", "video": FRAMES}, "Describe."), ANSWER],
        [user_turn({"type": "video", "video": "media/clip.mp4"}), ANSWER],
        [user_turn("Listen:", {"type": "audio", "audio": "media/speech.wav"}), ANSWER],
        [user_turn({"type": "audio"}), ANSWER],  # takes the row's `audios` column
        [{"role": "user", "content": "Just text."}, ANSWER],
    ]
    good = {
        0: [("image", [files["media/cat.jpg"]])],
        1: [("image", [files["media/dog.png"]]), ("image", [webp])],
        2: [("video", [files[f] for f in FRAMES])],
        3: [("video", [files["media/clip.mp4"]])],
        4: [("audio", [files["media/speech.wav"]])],
        5: [("audio", [flac])],
        6: [],
    }
    lines = [{"messages": messages} for messages in rows]
    lines[5]["audios"] = [{"bytes": b64(flac), "path": None}]  # an HF datasets Audio struct
    lines += [
        {"messages": [user_turn({"type": "image", "image": "media/broken.jpg"}), ANSWER]},
        {"messages": [user_turn({"type": "image", "image": "media/gone.jpg"}), ANSWER]},
        {"messages": [user_turn({"type": "image"}), ANSWER], "images": ["media/cat.jpg", "media/dog.png"]},
        {"messages": [user_turn({"type": "image", "image": "media/speech.wav"}), ANSWER]},
        {"messages": [user_turn({"type": "image", "image": "media/cat.jpg", "image_bytes": b64(webp)}), ANSWER]},
    ]
    bad = {("rows.jsonl", 7): "bad_media", ("rows.jsonl", 8): "missing_media", ("rows.jsonl", 9): "unreferenced_media",
           ("rows.jsonl", 10): "media_type_mismatch", ("rows.jsonl", 11): "invalid_media_part"}
    (folder / "rows.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    # Parquet, TRL style: a part without a source takes the next item of the binary `images` column.
    parquet_png = image_bytes(32, 32, 8, "PNG")
    content = pa.list_(pa.struct([("type", pa.string()), ("text", pa.string())]))
    schema = pa.schema([("messages", pa.list_(pa.struct([("role", pa.string()), ("content", content)]))),
                        ("images", pa.list_(pa.binary()))])
    messages = [{"role": "user", "content": [{"type": "image", "text": None}, {"type": "text", "text": "What?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Noise."}]}]
    pq.write_table(pa.Table.from_pylist([{"messages": messages, "images": [parquet_png]}], schema=schema),
                   folder / "more.parquet")
    expected = {sample_key("rows.jsonl", row): parts for row, parts in good.items()}
    expected[sample_key("more.parquet", 0)] = [("image", [parquet_png])]
    return folder, expected, bad


def run(folder, output):
    config = PreprocessConfig(inputs=[str(folder / "rows.jsonl"), str(folder / "more.parquet")], output=str(output),
                              splits={"train": 1.0}, target_shard_rows=3, progress=False)
    return run_preprocess(config)


@pytest.fixture(scope="module")
def media_run(ray_session, media_input, tmp_path_factory):
    folder, _, _ = media_input
    output = tmp_path_factory.mktemp("media_out") / "dataset"
    return output, run(folder, output)


def shard_members(root) -> dict[str, dict[str, bytes]]:
    """``{key: {member: bytes}}`` of every shard, in shard order."""
    samples: dict[str, dict[str, bytes]] = {}
    for shard in sorted((root / "shards").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                key, _, name = member.name.partition(".")
                samples.setdefault(key, {})[name] = tar.extractfile(member).read()
    return samples


@pytest.mark.timeout(120)
def test_media_rows_are_written_as_members_and_bad_media_quarantined(media_input, media_run):
    folder, expected, bad = media_input
    output, summary = media_run
    assert (summary.read, summary.accepted, summary.quarantined) == (13, 8, 5)
    assert summary.quarantined_by_reason == {reason: 1 for reason in sorted(bad.values())}
    quarantine = read_quarantine(output)
    assert {(q["file"], q["row"]): q["reason"] for q in quarantine} == bad
    messages = {q["row"]: q["message"] for q in quarantine}
    assert messages[7].startswith(
        "messages[0] content part 0 (media/broken.jpg): image member 'image-0.jpg' cannot be decoded (200 bytes): ")
    assert messages[8].startswith(f"messages[0] content part 0: cannot read {folder}/media/gone.jpg: [Errno 2] ")
    assert messages[9] == ("1 item(s) of the row's 'images' column are not taken by any image part; add a "
                           "{'type': 'image'} part per item or remove the items")
    assert messages[10] == ("messages[0] content part 0 (media/speech.wav): a image must be one of "
                            "['jpg', 'jpeg', 'png', 'webp'], found 'wav'")
    assert messages[11] == "messages[0] content part 0: give either 'image' (a path) or 'image_bytes', not both"
    assert all(q["raw"].startswith('{"messages"') for q in quarantine)

    samples = shard_members(output)
    assert list(samples) == [sample_key("more.parquet", 0)] + [sample_key("rows.jsonl", r) for r in range(7)]
    for key, parts in expected.items():
        members = samples[key]
        record = json.loads(members.pop("json"))
        references = [p for m in record["messages"] if isinstance(m["content"], list) for p in m["content"]
                      if p["type"] != "text"]
        assert [p["type"] for p in references] == [t for t, _ in parts], key
        stored = {}
        for part in references:
            names = part[part["type"]] if isinstance(part[part["type"]], list) else [part[part["type"]]]
            stored.update({name: members[name] for name in names})
            assert set(part) == {"type", part["type"]}, part
        assert set(stored) == set(members), key  # every member referenced, once
        assert list(stored.values()) == [data for _, files in parts for data in files], key
    rewritten = json.loads(shard_members(output)[sample_key("rows.jsonl", 2)]["json"])["messages"][0]["content"][0]
    assert rewritten == {"type": "video", "video": [f"video-0-f{i}.jpg" for i in range(4)]}
    assert sorted(samples[sample_key("rows.jsonl", 1)]) == ["image-0.png", "image-1.webp"]
    assert sorted(samples[sample_key("rows.jsonl", 5)]) == ["audio-0.flac"]

    info = load_dataset_info(output)
    member_bytes = [data for parts in expected.values() for _, files in parts for data in files]
    assert info["media"] == {"members": len(member_bytes), "bytes": sum(map(len, member_bytes))}
    assert info["token_lengths"]["count"] == 8


def _frames_of_mp4(data: bytes) -> list[Image.Image]:
    import av

    with av.open(io.BytesIO(data)) as container:
        return [frame.to_image() for frame in container.decode(video=0)]


def _waveform(data: bytes) -> np.ndarray:
    if data[:4] == b"RIFF":
        with wave.open(io.BytesIO(data)) as reader:
            return np.frombuffer(reader.readframes(reader.getnframes()), "<i2").astype(np.float32) / 32768
    import av

    with av.open(io.BytesIO(data)) as container:
        return np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]).astype(np.float32) / 32768


def expected_tensors(parts, processor) -> dict[str, torch.Tensor | None]:
    """The media tensors of one row: the image processor / feature extractor called directly."""
    found: dict[str, list[torch.Tensor]] = {key: [] for key in processor.media_keys}
    image_processor, extractor = processor.image_processor, processor.feature_extractor
    for part_type, files in parts:
        if part_type == "image":
            out = image_processor(images=[Image.open(io.BytesIO(files[0])).convert("RGB")], return_tensors="pt")
            found["pixel_values"].append(out["pixel_values"])
            found["image_grid_thw"].append(out["image_grid_thw"])
        elif part_type == "video":
            frames = _frames_of_mp4(files[0]) if len(files) == 1 else [Image.open(io.BytesIO(f)) for f in files]
            out = image_processor(images=[frames[0].convert("RGB"), frames[-1].convert("RGB")], return_tensors="pt")
            found["pixel_values_videos"].append(out["pixel_values"])
            found["video_grid_thw"].append(torch.tensor([[2, *out["image_grid_thw"][0, 1:].tolist()]]))
        else:
            out = extractor(_waveform(files[0]), sampling_rate=16000, return_tensors="pt", padding="longest",
                            pad_to_multiple_of=extractor.hop_length)
            found["input_features"].append(out["input_features"][0])
            found["audio_feature_lengths"].append(torch.tensor([out["input_features"].shape[-1]]))
    return {key: torch.cat(v, processor.media_keys[key]) if v else None for key, v in found.items()}


@pytest.mark.timeout(120)
def test_the_vlm_loader_yields_the_media_of_the_input_files(media_input, media_run, tokenizer):
    _, expected, _ = media_input
    output, _ = media_run
    processor = build_multimodal_processor(
        tokenizer, task_data_spec=TaskDataSpec(num_frames=2, pad_audio_to_hop_length=True))
    loader = build_energon_sft_loader(
        data_config={"energon": {"task": "vlm_sft"}}, source={"path": str(output), "split": "train"},
        processor=processor, batch_size=3, max_sequence_length=4096, split_role="validation", logical_rank=0,
        logical_world_size=1, placement_fingerprint="preprocess-media", packing_algorithm=None,
        max_sequences_per_bin=None, sequence_length_pad_multiple=1, only_unmask_final=False,
    )
    seen = []
    for batch in loader:
        multimodal = batch.get_multimodal_dict()
        assert sorted(multimodal) == sorted(processor.media_keys)
        assert torch.equal(batch["loss_multiplier"], torch.ones(len(batch["source_ids"])))
        for row, key in enumerate(batch["source_ids"]):
            seen.append(key)
            for name, want in expected_tensors(expected[key], processor).items():
                got = multimodal[name].tensors[row]
                if want is None:
                    assert got is None, (key, name)
                else:
                    assert got is not None and got.shape == want.shape and torch.equal(got, want), (key, name)
    assert sorted(seen) == sorted(expected)


@pytest.mark.timeout(120)
def test_two_runs_with_media_give_identical_shards(media_input, media_run, tmp_path):
    folder, _, _ = media_input
    first, _ = media_run
    run(folder, tmp_path / "again")
    names = sorted(p.name for p in (first / "shards").glob("*.tar"))
    assert names == sorted(p.name for p in (tmp_path / "again" / "shards").glob("*.tar")) and len(names) == 3
    for name in names:
        assert (first / "shards" / name).read_bytes() == (tmp_path / "again" / "shards" / name).read_bytes(), name
    assert (first / "quarantine.jsonl").read_bytes() == (tmp_path / "again" / "quarantine.jsonl").read_bytes()
    assert (first / ".nv-meta/index.uuid").read_text() == (tmp_path / "again" / ".nv-meta/index.uuid").read_text()


# -- without Ray: adapters, media resolution, shard size --------------------------------------


def test_llava_style_sharegpt_rows_become_media_parts(tmp_path):
    (tmp_path / "cat.jpg").write_bytes(image_bytes(32, 32, 1))
    row = {"image": "cat.jpg", "conversations": [{"from": "human", "value": "<image>\nWhat is it?"},
                                                 {"from": "gpt", "value": "A cat."}]}
    sample = sharegpt(row)
    assert sample == {"kind": "sft", "images": ["cat.jpg"], "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "\nWhat is it?"}]},
        {"role": "assistant", "content": "A cat."}]}
    resolved, members = resolve_media(sample, str(tmp_path))
    assert resolved == {"kind": "sft", "messages": [
        {"role": "user", "content": [{"type": "image", "image": "image-0.jpg"}, {"type": "text", "text": "\nWhat is it?"}]},
        {"role": "assistant", "content": "A cat."}]}
    assert members == {"image-0.jpg": (tmp_path / "cat.jpg").read_bytes()}
    assert sharegpt({"conversations": [{"from": "human", "value": "<image> as text"}]})["messages"][0]["content"] == "<image> as text"


def test_media_problems_name_the_reason_and_the_part(tmp_path):
    def reject(parts, **columns):
        with pytest.raises(RowRejected) as error:
            resolve_media({"kind": "sft", "messages": [user_turn(*parts), ANSWER], **columns}, str(tmp_path))
        return error.value.reason, error.value.message

    assert reject([{"type": "image"}]) == ("missing_media", "messages[0] content part 0: image part has no 'image' path "
                                           "nor 'image_bytes', and the row's 'images' column has no item left for it")
    assert reject([{"type": "image", "image_bytes": "not base64!"}])[0] == "bad_media"
    assert reject([{"type": "image", "image_bytes": b64(b"GIF89a....")}]) == (
        "bad_media", "messages[0] content part 0: cannot tell the format of the image bytes (starting b'GIF89a....'); "
                     "expected one of ['jpg', 'jpeg', 'png', 'webp']")
    assert reject([{"type": "audio", "audio_bytes": b64(image_bytes(8, 8, 0))}]) == (
        "media_type_mismatch", "messages[0] content part 0 (bytes): a audio must be one of ['wav', 'flac'], found 'jpg'")
    assert reject([{"type": "video", "video": []}]) == ("invalid_media_part", "messages[0] content part 0: video frame list is empty")
    assert reject(["x"], images="cat.jpg") == ("invalid_media_part", "media column 'images' must be a list, found str")
    assert [sniff_extension(d) for d in (image_bytes(8, 8, 0, "PNG"), mp4_bytes(1, 16, 16, 0), wav_bytes(tone(10, 0)))] == [
        "png", "mp4", "wav"]


def test_media_bytes_count_toward_the_shard_size(tmp_path):
    media = [[{"name": "image-0.jpg", "data": b"\xff" * 3000}] for _ in range(5)]
    batch = pa.Table.from_pydict({
        "file": ["a.jsonl"] * 5, "row": list(range(5)), "key": [sample_key("a.jsonl", r) for r in range(5)],
        "accepted": [True] * 5, "kind": ["sft"] * 5, "payload": [b'{"kind":"sft"}'] * 5, "media": media,
        "num_tokens": [5] * 5, "reason": [""] * 5, "message": [""] * 5, "raw": [""] * 5, "content_hash": list(range(5)),
    }, schema=OUTPUT_SCHEMA)
    writer = DatasetWriter(tmp_path, target_shard_bytes=8000, target_shard_rows=None)
    writer.add_batch(batch)
    stats = writer.close()
    assert [s.samples for s in stats.shards] == [2, 2, 1]  # (14 + 1024) + (3000 + 1024) bytes a sample
    assert (stats.media_members, stats.media_bytes) == (5, 15000)
    with tarfile.open(tmp_path / stats.shards[0].path) as tar:
        assert tar.getnames() == [f"{sample_key('a.jsonl', r)}.{m}" for r in (0, 1) for m in ("image-0.jpg", "json")]
