"""A restored packing loader gets its packing buffers' encoded samples from the state
(:mod:`rl_data.energon.packing_restore`) instead of re-encoding them, with the same batches.

Encode calls are logged (by the cooked sample's restore key) to a file, so the calls of Energon
worker processes are counted too: a buffered sample re-encoded on restore is encoded under the
restore key it had when it was first encoded.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from energon_fixtures import batch_source_ids, make_loader, write_chat_dataset
from restore_check import assert_restores_at_every_step, stream, torch_roundtrip

from rl_data.energon.compat import internals
from rl_data.energon.packing_restore import STATE_KEY, PackingRestoreCache
from rl_data.energon.sft_dataloader import EnergonSFTDataLoader
from rl_data.energon.state_codec import decode_rank_state, encode_rank_state
from rl_data.energon.task_encoders.chat_sft import ChatSFTTaskEncoder


class _Level(enum.IntEnum):
    HIGH = 2


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, chat_conversations):
    """40 conversations of up to 4 messages, 10 shards of 4, all in the train split."""
    return write_chat_dataset(
        tmp_path_factory.mktemp("packed_restore"),
        chat_conversations[:40],
        samples_per_shard=4,
        splits={"train": 1.0},
        max_messages=4,
    )


#: Packed batches of 2 (first fit decreasing, buffer 8). checkpoint_every_sec tiny: every worker
#: checkpoint is at the batch delivered, so a restore replays nothing in the workers and restores
#: the packing buffers from the state.
LOADER = {
    "energon": {"shuffle_buffer_size": 6, "max_samples_per_sequence": 2, "checkpoint_every_sec": 0.001},
    "packing_buffer": 8,
    "batch_size": 2,
    "max_sequence_length": 256,
}


def _packed_view(batch):
    ids, _ = batch_source_ids(batch)
    return ids, {name: batch[name] for name in ("input_ids", "input_lengths", "token_mask", "sample_mask")}


@pytest.fixture
def encode_log(tmp_path, monkeypatch):
    """A file with one line per ``encode_sample`` call (any process): the cooked sample's restore key."""
    path = tmp_path / "encodes.jsonl"
    original = ChatSFTTaskEncoder.encode_sample

    @functools.wraps(original)
    def logged(self, sample):
        with path.open("a") as log:
            log.write(json.dumps(sample.__restore_key__) + "\n")
        return original(self, sample)

    monkeypatch.setattr(ChatSFTTaskEncoder, "encode_sample", logged)
    return path


def _encoded_keys(path) -> list[tuple]:
    if not path.exists():
        return []
    return [_as_tuple(json.loads(line)) for line in path.read_text().splitlines()]


def _as_tuple(value):
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list) else value


def _states(state, select) -> list:
    """``select(mapping)`` of every mapping in a loader state's Energon rank state that has one."""
    found = []

    def walk(value):
        if isinstance(value, dict):
            selected = select(value)
            if selected is not None:
                found.append(selected)
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif hasattr(value, "__dataclass_fields__"):
            for name in value.__dataclass_fields__:
                walk(getattr(value, name))

    walk(decode_rank_state(state["loader_state"].numpy().tobytes()))
    return found


def _saved_caches(state) -> list[dict]:
    """The packing restore payloads of every worker in a loader state."""
    return _states(state, lambda value: value.get(STATE_KEY))


def _buffered(state) -> set[tuple]:
    """Restore keys (as ``encode_sample`` saw them) of the samples in the packing buffers, from
    Energon's own state of its packing datasets."""
    packings = _states(state, lambda value: value if value.get("__class__") == "PackingDataset" else None)
    return {
        key[2:]  # without the encode stage's ("MapDataset", index)
        for packing in packings
        for buffer in ("_reading_buffer", "_pre_packing_buffer")
        for key in packing[buffer]["_restore_keys"]
    }


def _without_caches(state) -> dict:
    """``state`` as an rl_data without the packing restore cache saved it."""

    def strip(value):
        if isinstance(value, dict):
            value.pop(STATE_KEY, None)
            for item in value.values():
                strip(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                strip(item)
        elif hasattr(value, "__dataclass_fields__"):
            for name in value.__dataclass_fields__:
                strip(getattr(value, name))
        return value

    rank_state = strip(decode_rank_state(state["loader_state"].numpy().tobytes()))
    payload = bytearray(encode_rank_state(rank_state))
    return {**state, "loader_state": torch.frombuffer(payload, dtype=torch.uint8).clone()}


def _deferred_state(loader: EnergonSFTDataLoader) -> dict:
    return loader.state_dict_deferring()[0]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("num_workers", "save"),
    [(0, EnergonSFTDataLoader.state_dict), (0, _deferred_state), (2, EnergonSFTDataLoader.state_dict)],
    ids=["0_workers", "0_workers-deferred", "2_workers"],
)
def test_packed_loader_restores_exactly_at_every_step(dataset, tokenizer, num_workers, save):
    assert_restores_at_every_step(
        lambda: make_loader(dataset, tokenizer, **LOADER, workers=num_workers),
        steps=7 if num_workers else 13,
        extract=_packed_view,
        close=EnergonSFTDataLoader.close,
        save=save,
    )


def _states_after_every_batch(dataset, tokenizer, steps: int) -> dict[int, dict]:
    """``{k: state_dict() after k batches}`` of a fresh 0-worker loader."""
    loader = make_loader(dataset, tokenizer, **LOADER, workers=0)
    states = {}
    stream(loader, _packed_view, steps, on_step=lambda k: states.__setitem__(k, loader.state_dict()))
    loader.close()
    return states


@pytest.mark.timeout(120)
def test_a_deferred_state_leaves_the_buffers_out_and_completes_later_to_the_state_of_its_moment(
    dataset, tokenizer, encode_log
):
    loader = make_loader(dataset, tokenizer, **LOADER, workers=0)
    reference = stream(loader, _packed_view, 7)
    loader.close()
    full = _states_after_every_batch(dataset, tokenizer, 6)
    loader = make_loader(dataset, tokenizer, **LOADER, workers=0)
    deferred = {}
    stream(loader, _packed_view, 6, on_step=lambda k: deferred.__setitem__(k, loader.state_dict_deferring()))
    # completed after the loader moved on (and in another order): the state of its own moment
    for k in (5, 2, 3):
        light, complete = deferred[k]
        assert complete is not None and not _saved_caches(light) and _saved_caches(full[k])
        completed = complete()
        assert torch.equal(completed["loader_state"], full[k]["loader_state"]), k
        assert {n: v for n, v in completed.items() if n != "loader_state"} == {
            n: v for n, v in light.items() if n != "loader_state"
        }
    loader.close()

    light, complete = deferred[3]
    buffered = _buffered(light)
    assert buffered, "the packing buffers are empty in the saved state: nothing to check"
    for state, re_encodes in ((light, True), (complete(), False)):
        encode_log.unlink(missing_ok=True)
        restored = make_loader(dataset, tokenizer, **LOADER, workers=0)
        restored.load_state_dict(torch_roundtrip(state))
        rest = stream(restored, _packed_view, 4)
        restored.close()
        assert (buffered <= set(_encoded_keys(encode_log))) is re_encodes
        assert [s.ids for s in rest] == [s.ids for s in reference[3:]]
        for want, got in zip(reference[3:], rest):
            assert all(torch.equal(want.tensors[n], got.tensors[n]) for n in want.tensors)


@pytest.mark.timeout(120)
def test_deferred_states_complete_in_another_thread_while_the_loader_iterates(dataset, tokenizer):
    # what a rank actor does: completions run beside the loader's thread
    full = _states_after_every_batch(dataset, tokenizer, 10)
    loader = make_loader(dataset, tokenizer, **LOADER, workers=0)
    completed = {}

    def defer(k):
        light, complete = loader.state_dict_deferring()
        completed[k] = completer.submit(complete or (lambda: light))  # before the first batch: nothing deferred

    with ThreadPoolExecutor(max_workers=1) as completer:
        stream(loader, _packed_view, 10, on_step=defer)
        for k, future in completed.items():
            assert torch.equal(future.result(timeout=60)["loader_state"], full[k]["loader_state"]), k
    loader.close()


@pytest.mark.timeout(120)
def test_with_workers_a_deferred_state_is_complete(dataset, tokenizer):
    # each worker's checkpoint crosses to the loader pickled, which resolves it in the worker
    loader = make_loader(dataset, tokenizer, **LOADER, workers=2)
    stream(loader, _packed_view, 3)
    state, complete = loader.state_dict_deferring()
    loader.close()
    assert complete is None and len(_saved_caches(state)) == 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2], ids=["0_workers", "2_workers"])
def test_restore_does_not_re_encode_the_packing_buffers(dataset, tokenizer, encode_log, num_workers):
    loader = make_loader(dataset, tokenizer, **LOADER, workers=num_workers)
    reference = stream(loader, _packed_view, 6)
    loader.close()
    loader = make_loader(dataset, tokenizer, **LOADER, workers=num_workers)
    stream(loader, _packed_view, 3)
    state = torch_roundtrip(loader.state_dict())
    loader.close()
    buffered = _buffered(state)
    assert buffered, "the packing buffers are empty in the saved state: nothing to check"

    encode_log.unlink(missing_ok=True)
    restored = make_loader(dataset, tokenizer, **LOADER, workers=num_workers)
    restored.load_state_dict(state)
    rest = stream(restored, _packed_view, 3)
    restored.close()
    re_encoded = buffered & set(_encoded_keys(encode_log))
    assert not re_encoded, f"{len(re_encoded)} of {len(buffered)} buffered samples were re-encoded on restore"
    assert len(_saved_caches(state)) == max(1, num_workers)  # one per worker
    assert [s.ids for s in rest] == [s.ids for s in reference[3:]]
    for want, got in zip(reference[3:], rest):
        assert all(torch.equal(want.tensors[n], got.tensors[n]) for n in want.tensors)


@pytest.mark.timeout(120)
def test_restore_encodes_only_what_the_uninterrupted_run_encodes(dataset, tokenizer, encode_log):
    # 0 workers: restore + first batch encodes exactly the new samples the uninterrupted run
    # encoded for that batch (the buffered ones come from the state)
    loader = make_loader(dataset, tokenizer, **LOADER, workers=0)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    state = torch_roundtrip(loader.state_dict())
    before = len(_encoded_keys(encode_log))
    next(batches)
    uninterrupted = _encoded_keys(encode_log)[before:]
    loader.close()

    encode_log.unlink(missing_ok=True)
    restored = make_loader(dataset, tokenizer, **LOADER, workers=0)
    restored.load_state_dict(state)
    next(iter(restored))
    restored.close()
    assert _encoded_keys(encode_log) == uninterrupted


@pytest.mark.timeout(120)
def test_a_state_without_the_cache_restores_exactly_by_re_encoding(dataset, tokenizer, encode_log):
    loader = make_loader(dataset, tokenizer, **LOADER, workers=0)
    reference = stream(loader, _packed_view, 6)
    loader.close()
    loader = make_loader(dataset, tokenizer, **LOADER, workers=0)
    stream(loader, _packed_view, 3)
    state = torch_roundtrip(loader.state_dict())
    loader.close()
    buffered = _buffered(state)
    old_state = torch_roundtrip(_without_caches(state))
    assert not _saved_caches(old_state)

    encode_log.unlink(missing_ok=True)
    restored = make_loader(dataset, tokenizer, **LOADER, workers=0)
    restored.load_state_dict(old_state)
    rest = stream(restored, _packed_view, 3)
    restored.close()
    assert buffered <= set(_encoded_keys(encode_log))  # re-encoded, as before the cache
    assert [s.ids for s in rest] == [s.ids for s in reference[3:]]
    for want, got in zip(reference[3:], rest):
        assert all(torch.equal(want.tensors[n], got.tensors[n]) for n in want.tensors)


def test_a_state_of_another_adapter_is_refused(dataset, tokenizer):
    loader = make_loader(dataset, tokenizer, **LOADER, workers=0)
    stream(loader, _packed_view, 2)
    state = torch_roundtrip(loader.state_dict())
    loader.close()
    energon = {"shuffle_buffer_size": 6, "max_samples_per_sequence": 2}
    other = make_loader(dataset, tokenizer, **{**LOADER, "energon": energon}, data_config={"add_eos": False})
    with pytest.raises(ValueError, match="identity changed: adapter"):
        other.load_state_dict(state)


def _cache_of(loader: EnergonSFTDataLoader) -> PackingRestoreCache:
    dataset = loader._loader.dataset
    while not isinstance(dataset, PackingRestoreCache):
        dataset = dataset.dataset
    return dataset


def test_a_saved_sample_rebuilds_equal_and_others_are_not_saved(dataset, tokenizer):
    loader = make_loader(dataset, tokenizer, **LOADER, workers=0)
    stream(loader, _packed_view, 2)
    cache = _cache_of(loader)
    samples = [sample for buffer in internals.packing_buffers(cache._packing) for sample in buffer.buffer]
    loader.close()
    assert samples
    for sample in samples:
        rebuilt = cache._rebuild(sample.__restore_key__, cache._compact(sample))
        assert type(rebuilt) is type(sample)
        for field in dataclasses.fields(sample):
            if field.name != "message_log":
                assert getattr(rebuilt, field.name) == getattr(sample, field.name), field.name
        assert len(rebuilt.message_log) == len(sample.message_log)
        for want, got in zip(sample.message_log, rebuilt.message_log):
            assert list(got) == list(want)  # same keys, same order
            assert torch.equal(got["token_ids"], want["token_ids"]) and got["token_ids"].dtype == torch.int64
            assert {k: v for k, v in got.items() if k != "token_ids"} == {
                k: v for k, v in want.items() if k != "token_ids"
            }
    sample = samples[0]
    first = sample.message_log[0]
    not_json = [
        {"tool_calls": ("a tuple",)},  # would come back as a list
        {"pixels": torch.zeros(2)},  # media tensors
        {"content": float("nan")},
        {"meta": {1: "a non-str key"}},  # would come back as "1"
        {"weight": _Level.HIGH},  # an int subclass: would come back as a plain int
        {"content": "a lone surrogate \ud800"},  # not UTF-8
    ]
    for extra in not_json:
        message = {**{k: v for k, v in first.items() if k != "token_ids"}, **extra, "token_ids": first["token_ids"]}
        changed = dataclasses.replace(sample, message_log=[message, *sample.message_log[1:]])
        assert cache._compact(changed) is None, extra
    token_ids_not_last = {"token_ids": first["token_ids"], **{k: v for k, v in first.items() if k != "token_ids"}}
    assert cache._compact(dataclasses.replace(sample, message_log=[token_ids_not_last])) is None


def _saved_buffers(dataset, tokenizer) -> tuple[PackingRestoreCache, dict]:
    """The cache of a packing loader after 2 batches, and its saved packing buffer samples."""
    loader = make_loader(dataset, tokenizer, **LOADER, workers=0)
    stream(loader, _packed_view, 2)
    cache = _cache_of(loader)
    payload = cache._resolve(cache._capture())
    loader.close()
    return cache, payload


def test_saved_samples_of_another_encoder_are_ignored_and_another_version_refused(dataset, tokenizer):
    cache, payload = _saved_buffers(dataset, tokenizer)
    assert len(cache._from_state(payload)) == len(payload["restore_keys"]) > 0
    assert cache._from_state({**payload, "fingerprint": "another encoder"}) == {}  # re-encoded
    with pytest.raises(ValueError, match=r"version 3, expected one of \(1, 2\)"):
        cache._from_state({**payload, "version": 3})
    with pytest.raises(ValueError, match="damaged"):
        cache._from_state({**payload, "samples": payload["samples"][1:]})
    with pytest.raises(ValueError, match="damaged"):
        cache._from_state({**payload, "samples": [{**payload["samples"][0], "size": "12"}, *payload["samples"][1:]]})
    key, sample = payload["restore_keys"][0], payload["samples"][0]
    for broken in ({**sample, "blob": sample["blob"][:-3]}, {**sample, "size": sample["size"] - 1},
                   {**sample, "size": sample["size"] + 1}):  # fmt: skip
        with pytest.raises(ValueError, match="damaged"):
            cache._rebuild(key, cache._from_state({**payload, "samples": [broken, *payload["samples"][1:]]})[key])


def test_a_version_1_state_of_zlib_blobs_still_restores(dataset, tokenizer):
    cache, payload = _saved_buffers(dataset, tokenizer)
    current = cache._from_state(payload)
    version_1 = {
        **payload,
        "version": 1,
        "samples": [{"blob": zlib.compress(saved.raw(), 1), "counts": saved.counts} for saved in current.values()],
    }
    for key, saved in cache._from_state(version_1).items():
        assert saved.size is None
        old, new = cache._rebuild(key, saved), cache._rebuild(key, current[key])
        assert len(old.message_log) == len(new.message_log) > 0
        assert all(
            torch.equal(a["token_ids"], b["token_ids"]) and a.keys() == b.keys() for a, b in zip(old.message_log, new.message_log)
        )
        assert [m["content"] for m in old.message_log] == [m["content"] for m in new.message_log]
        assert (old.length, old.loss_multiplier) == (new.length, new.loss_multiplier)
