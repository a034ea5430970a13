"""Multimodal and preference data through the distributed runtime.

A coordinator with 2 logical ranks runs over an image dataset (packing off and on) and over a
preference dataset. Freshly started, it restores the checkpoint of step k (the loader states after
k batches, read directly) into its new rank actors and continues; rewound to its start, it commits
k steps, hands out one more, checkpoints, loads that checkpoint in place (a rewind dropping the
pending step) and continues, and is rewound to the checkpoint of every committed step. Every step's
per-rank batches must equal the uninterrupted stream read directly from the loaders (sample ids,
media shapes, exact tensors); fetched multimodal batches carry, per row, the media of their own
sources; nested media cross the object store zero-copy.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import pytest
import torch
from PIL import Image

from distributed_fixtures import TIMEOUT_S, reference_batches_and_states, running_coordinator, runtime_config
from multimodal_fixtures import image_bytes, sft_record, user_turn, write_raw_dataset
from restore_check import assert_resumes_from_every_state, record_steps
from rl_data.distributed.client import CoordinatorClient
from rl_data.distributed.config import LoaderSpec
from rl_data.energon.multimodal.task_encoders import load_default_multimodal_processor
from rl_data.energon.sample_format import encode_sample
from rl_data.packed_tensor import PackedTensor

MULTIMODAL_FACTORY = "rl_data.energon.multimodal.task_encoders.processor:load_default_multimodal_processor"
IMAGE_KEYS = ("pixel_values", "image_grid_thw")
OTHER_MEDIA_KEYS = ("pixel_values_videos", "video_grid_thw", "input_features", "audio_feature_lengths")
COMMITTED, RESUMED = 2, 2
ANSWER = {"role": "assistant", "content": "Noise."}


def _image_sample(row: int) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Row % 4: one image (3 sizes) or two images in two turns; every 5th row is text only."""
    if row % 5 == 4:
        return sft_record([{"role": "user", "content": "No picture today."}, ANSWER], row), {}
    if row % 4 == 3:
        messages = [user_turn({"type": "image", "image": "a.png"}, "and"), ANSWER, user_turn({"type": "image", "image": "b.jpg"}), ANSWER]
        return sft_record(messages, row), {"a.png": image_bytes(56, 56, row, "PNG"), "b.jpg": image_bytes(84, 56, row)}
    width = 56 + 28 * (row % 3)
    return sft_record([user_turn("What is this?", {"type": "image", "image": "p.jpg"}), ANSWER], row), {"p.jpg": image_bytes(width, 84, row)}


@pytest.fixture(scope="module")
def processor():
    """The processor every rank actor builds from ``MULTIMODAL_FACTORY``."""
    return load_default_multimodal_processor()


@pytest.fixture(scope="module")
def image_dataset(tmp_path_factory):
    """40 image conversations in 10 shards of 4 (all train); key -> media members."""
    root = tmp_path_factory.mktemp("runtime_images")
    samples, media = [], {}
    for row in range(40):
        record, members = _image_sample(row)
        key = f"img-{row:03d}"
        samples.append((key, encode_sample(record, members)))
        media[key] = members
    write_raw_dataset(root, samples, samples_per_shard=4, splits={"train": 1})
    return root, media


@pytest.fixture(scope="module")
def preference_dataset(tmp_path_factory, chat_conversations):
    """40 pairs from chitchat (chosen: the real reply; rejected: another conversation's reply)."""
    root = tmp_path_factory.mktemp("runtime_preference")
    usable = [c["messages"] for c in chat_conversations if len(c["messages"]) >= 2 and c["messages"][0]["role"] == "user"]
    samples = []
    for i in range(40):
        record = {
            "kind": "preference",
            "context": [usable[i][0]],
            "chosen": [{"role": "assistant", "content": usable[i][1]["content"]}],
            "rejected": [{"role": "assistant", "content": usable[i + 40][1]["content"]}],
            "source": {"file": "chitchat", "row": i},
        }
        samples.append((f"pair-{i:03d}", encode_sample(record)))
    write_raw_dataset(root, samples, samples_per_shard=4, splits={"train": 1})
    return root


def _spec(root, task_encoder: str, batch_format: str | None = None, **overrides: Any) -> LoaderSpec:
    energon = {"task": task_encoder, "shuffle_buffer_size": 8, "max_samples_per_sequence": 4, **overrides.pop("energon", {})}
    args: dict[str, Any] = dict(
        data_config={"energon": energon, "shuffle": True, "batch_format": batch_format},
        source={"path": str(root), "split": "train", "virtual_epoch_length": 3},
        batch_size=2,
        max_sequence_length=256,
    )
    args.update(overrides)
    return LoaderSpec(**args)


def _take_steps(ray: Any, coordinator: Any, steps: int, *, commit: bool = True) -> list[list[Any]]:
    """``[step][rank] -> fetched batch`` of ``steps`` steps (each committed unless ``commit`` is False)."""
    taken = []
    for _ in range(steps):
        step, refs = ray.get(coordinator.next_step.remote(), timeout=TIMEOUT_S)
        taken.append(ray.get(refs, timeout=TIMEOUT_S))
        if commit:
            ray.get(coordinator.commit.remote(step), timeout=TIMEOUT_S)
    return taken


def _run_interrupted(
    ray: Any, spec: LoaderSpec, config: Any, directory: Any, expected: list[list[Any]], committed_states: list[dict]
) -> tuple[list, list]:
    """The batches of a fresh coordinator restoring the checkpoint of step COMMITTED (a restarted
    job; ``committed_states``: its rank states), and of the same coordinator rewound to its start:
    committed steps and one handed out, never committed. That run's checkpoint, loaded in place (a
    rewind), and the checkpoint of every committed step continue with the ``expected`` sample ids too."""
    with running_coordinator(ray, config, spec) as coordinator:
        client = CoordinatorClient(coordinator, timeout_s=TIMEOUT_S)
        start = client.origin_state_dict()
        client.load_state_dict({**start, "step": COMMITTED, "ranks": committed_states})
        assert client.progress()["rewinds"] == 0  # a fresh coordinator's restore
        after = _take_steps(ray, coordinator, RESUMED)

        def take() -> list[Any]:
            step, refs = client.next_step()
            batches = ray.get(refs, timeout=TIMEOUT_S)
            client.commit(step)
            return batches

        client.load_state_dict(start)
        before, states = record_steps(take, client.state_dict, COMMITTED)
        before += _take_steps(ray, coordinator, 1, commit=False)  # handed out, never committed
        client.save_checkpoint(str(directory))
        assert client.load_checkpoint(str(directory)) == COMMITTED  # a rewind: the pending step is dropped
        ids = [[list(batch["source_ids"]) for batch in step] for step in expected]
        assert [[list(batch["source_ids"]) for batch in take()] for _ in range(RESUMED)] == ids[COMMITTED:]
        assert_resumes_from_every_state(
            lambda: [list(batch["source_ids"]) for batch in take()], client.load_state_dict, states, ids[:COMMITTED]
        )
    return before, after


def _assert_same_steps(found: list[list[Any]], expected: list[list[Any]], view) -> None:
    assert len(found) == len(expected)
    for step, (found_ranks, expected_ranks) in enumerate(zip(found, expected)):
        for rank, (got, want) in enumerate(zip(found_ranks, expected_ranks)):
            got_ids, got_tensors = view(got)
            want_ids, want_tensors = view(want)
            assert got_ids == want_ids, f"step {step} rank {rank}"
            assert got_tensors.keys() == want_tensors.keys()
            for name, tensor in want_tensors.items():
                assert torch.equal(got_tensors[name], tensor), f"step {step} rank {rank}: {name} differs"


# -- multimodal ---------------------------------------------------------------------------------


def media_view(batch: Any) -> tuple[list, dict[str, torch.Tensor]]:
    """Ids and per-row media shapes (as ``(ids, shapes)``), plus the exact media and token tensors."""
    multimodal = batch.get_multimodal_dict()
    shapes = {key: [None if t is None else tuple(t.shape) for t in multimodal[key].tensors] for key in IMAGE_KEYS + OTHER_MEDIA_KEYS}
    tensors = {key: multimodal[key].as_tensor() for key in IMAGE_KEYS}
    if "message_log" in batch:
        tensors["tokens"] = torch.cat([m["token_ids"] for log in batch["message_log"] for m in log])
    else:
        tensors["input_ids"] = batch["input_ids"]
    return (batch["source_ids"], shapes), tensors


def _expected_rows(sources: list[str], media: dict[str, dict[str, bytes]], processor: Any) -> dict[str, Any]:
    """A row's image tensors: the image processor called directly on its sources' images, in order."""
    images = [Image.open(io.BytesIO(data)).convert("RGB") for key in sources for data in media[key].values()]
    if not images:
        return {"pixel_values": None, "image_grid_thw": None}
    outputs = [processor.image_processor(images=[image], return_tensors="pt") for image in images]
    return {key: torch.cat([o[key] for o in outputs]) for key in IMAGE_KEYS}


def _assert_rows_match_sources(batch: Any, media: dict[str, dict[str, bytes]], processor: Any) -> None:
    multimodal = batch.get_multimodal_dict()
    rows = batch["source_ids"] if "cu_seqlens" in batch else [[key] for key in batch["source_ids"]]
    for row, sources in enumerate(rows):
        expected = _expected_rows(sources, media, processor)
        for key in IMAGE_KEYS:
            got, want = multimodal[key].tensors[row], expected[key]
            assert (got is None) == (want is None) and (want is None or torch.equal(got, want)), (sources, key)
        assert all(multimodal[key].tensors[row] is None for key in OTHER_MEDIA_KEYS)
    if "message_log" in batch:  # the per-message media are the row's media, in message order
        for row, log in enumerate(batch["message_log"]):
            nested = [m["pixel_values"].as_tensor() for m in log if isinstance(m.get("pixel_values"), PackedTensor)]
            want = multimodal["pixel_values"].tensors[row]
            if want is None:
                assert nested == []
            else:
                assert torch.equal(torch.cat(nested), want)


PACKING = dict(
    energon={"packing_buffer_size": 4},
    packing_algorithm="first_fit_decreasing",
    sequence_length_pad_multiple=8,
)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("packing", [pytest.param(False, marks=pytest.mark.slow), True], ids=["unpacked", "packed"])
def test_multimodal_restore_continues_the_uninterrupted_stream(ray_session, image_dataset, processor, tmp_path, packing):
    ray = ray_session
    root, media = image_dataset
    spec = _spec(root, "vlm_sft", processor_factory=MULTIMODAL_FACTORY, **(PACKING if packing else {}))
    config = runtime_config(2, 1)
    expected, states = reference_batches_and_states(spec, config, processor, COMMITTED + RESUMED)
    before, after = _run_interrupted(ray, spec, config, tmp_path / "ckpt", expected, states[COMMITTED - 1])
    _assert_same_steps(before, expected[: COMMITTED + 1], media_view)
    _assert_same_steps(after, expected[COMMITTED:], media_view)
    fetched = [batch for step in before + after for batch in step]
    for batch in fetched:
        _assert_rows_match_sources(batch, media, processor)
    images = [t for b in fetched for t in b.get_multimodal_dict()["pixel_values"].tensors if t is not None]
    assert len({t.shape for t in images}) > 1  # rows of different sizes crossed the object store
    if packing:
        assert any(len(pack) > 1 for b in fetched for pack in b["source_ids"])


@pytest.mark.timeout(120)
def test_nested_media_cross_the_object_store_zero_copy(ray_session, image_dataset, processor):
    ray = ray_session
    root, _ = image_dataset
    spec = _spec(root, "vlm_sft", batch_format="message_log")  # media nested in the message logs
    batch = reference_batches_and_states(spec, runtime_config(1, 0), processor, 1)[0][0][0]
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(batch, protocol=5, buffer_callback=buffers.append)
    tensors = [t for m in (m for log in batch["message_log"] for m in log) for t in _message_tensors(m)]
    tensors += [t for p in batch.get_multimodal_dict().values() for t in p.tensors if t is not None]
    tensors += [v for v in batch.values() if isinstance(v, torch.Tensor)]  # loss_multiplier
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    assert len(storages) < len(tensors)  # one-image rows of the batch-level dict share the message's tensor
    assert sum(memoryview(b).nbytes for b in buffers) == sum(storages.values())  # each storage once, out of band
    assert len(stream) < 4096  # only structure and strings stay in band

    ref = ray.put(batch)
    first, second = ray.get(ref, timeout=TIMEOUT_S), ray.get(ref, timeout=TIMEOUT_S)
    pixels = [m["pixel_values"].tensors[0] for m in first["message_log"][0] if "pixel_values" in m]
    again = [m["pixel_values"].tensors[0] for m in second["message_log"][0] if "pixel_values" in m]
    assert pixels and [t.data_ptr() for t in pixels] == [t.data_ptr() for t in again]  # both view the store
    originals = [m["pixel_values"].tensors[0] for m in batch["message_log"][0] if "pixel_values" in m]
    assert all(torch.equal(a, b) for a, b in zip(pixels, originals, strict=True))


def _message_tensors(message: dict[str, Any]) -> list[torch.Tensor]:
    found = []
    for value in message.values():
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, PackedTensor):
            found.extend(t for t in value.tensors if t is not None)
    return found


# -- preference ---------------------------------------------------------------------------------


def preference_view(batch: Any) -> tuple[list, dict[str, torch.Tensor]]:
    tensors = {
        side: torch.cat([m["token_ids"] for log in batch[f"message_log_{side}"] for m in log])
        for side in ("chosen", "rejected")
    }
    tensors.update({key: batch[key] for key in ("length_chosen", "length_rejected", "loss_multiplier")})
    return list(batch["source_ids"]), tensors


@pytest.mark.timeout(120)
def test_preference_restore_continues_the_uninterrupted_stream(ray_session, preference_dataset, tokenizer, tmp_path):
    ray = ray_session
    spec, config = _spec(preference_dataset, "preference"), runtime_config(2, 1)
    expected, states = reference_batches_and_states(spec, config, tokenizer, COMMITTED + RESUMED)
    before, after = _run_interrupted(ray, spec, config, tmp_path / "ckpt", expected, states[COMMITTED - 1])
    _assert_same_steps(before, expected[: COMMITTED + 1], preference_view)
    _assert_same_steps(after, expected[COMMITTED:], preference_view)
    batch = after[-1][1]
    assert sorted(batch) == sorted(
        ["message_log_chosen", "message_log_rejected", "length_chosen", "length_rejected", "loss_multiplier", "source_ids"]
    )
    for row in range(batch.size):
        for side in ("chosen", "rejected"):
            assert int(batch[f"length_{side}"][row]) == sum(len(m["token_ids"]) for m in batch[f"message_log_{side}"][row])
    ids = [i for step in before[:COMMITTED] + after for b in step for i in b["source_ids"]]
    assert len(ids) == len(set(ids)) == (COMMITTED + RESUMED) * 2 * 2  # none missing, none twice
