"""The Energon rank state codec: real states round-trip exactly; anything outside the allow-list,
a crafted payload or an old pickled state is refused and never runs."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import numpy
import pytest
import torch
from megatron.energon.savable_loader import SavableDataLoaderState, SavableDatasetCheckpoint
from megatron.energon.state import FlexState

from energon_fixtures import make_loader
from restore_check import torch_roundtrip
from rl_data.distributed.checkpoint_files import load_checkpoint_file, save_checkpoint_file
from rl_data.energon.state_codec import (
    CODEC,
    TAGS,
    DeferredValue,
    EncodedValueCache,
    StateCodecError,
    decode_rank_state,
    encode_rank_state,
)

#: Batches of 2, shuffle buffer 20 (packed: first fit decreasing, buffer 8).
LOADER = {"energon": {"shuffle_buffer_size": 20}, "batch_size": 2}


def _assert_identical(found, expected, where="state"):
    if isinstance(expected, DeferredValue):
        expected = expected.resolve()  # saved as what it resolves to
    assert type(found) is type(expected), f"{where}: {type(found)} != {type(expected)}"
    if isinstance(expected, torch.Tensor):
        assert found.dtype == expected.dtype and torch.equal(found, expected), where
    elif isinstance(expected, numpy.ndarray):
        assert found.dtype == expected.dtype and numpy.array_equal(found, expected), where
    elif dataclasses.is_dataclass(expected):
        for field in dataclasses.fields(expected):
            name = field.name
            _assert_identical(getattr(found, name), getattr(expected, name), f"{where}.{name}")
    elif isinstance(expected, dict):
        assert list(found) == list(expected), where
        for key in expected:
            _assert_identical(found[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(found) == len(expected), where
        for i, (a, b) in enumerate(zip(found, expected)):
            _assert_identical(a, b, f"{where}[{i}]")
    else:
        assert found == expected, where


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("workers", "packing", "role"),
    [
        (0, False, "train"),
        (0, True, "train"),
        (0, False, "validation"),
        (2, True, "train"),
        (2, False, "validation"),
    ],
    ids=["0w", "0w-packing", "0w-val", "2w-packing", "2w-val"],
)
def test_real_rank_states_round_trip_exactly(energon_dataset, tokenizer, workers, packing, role):
    loader = make_loader(energon_dataset, tokenizer, **LOADER, workers=workers, packing_buffer=8 if packing else None, role=role)
    batches = iter(loader)
    next(batches), next(batches)
    stream = loader._stream
    raw = stream.energon_state() if stream is not None else loader._loader.save_state_rank()
    loader.close()
    encoded = encode_rank_state(raw)
    decoded = decode_rank_state(encoded)
    _assert_identical(decoded, raw)
    assert encode_rank_state(decoded) == encoded
    assert decode_rank_state(encode_rank_state(None)) is None  # the initial state


@pytest.mark.timeout(60)
def test_envelope_restores_after_torch_save_and_weights_only_load(energon_dataset, tokenizer):
    loader = make_loader(energon_dataset, tokenizer, **LOADER, packing_buffer=8)
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    expected = next(batches)["source_ids"]
    restored = make_loader(energon_dataset, tokenizer, **LOADER, packing_buffer=8)
    restored.load_state_dict(torch_roundtrip(state))
    assert next(iter(restored))["source_ids"] == expected
    assert json.loads(state["loader_state"].numpy().tobytes())["codec"] == CODEC


def test_a_type_outside_the_allow_list_is_refused_on_save():
    class Custom:
        pass

    state = FlexState(datasets=[FlexState(buffer=[("Webdataset", 1), Custom()])])
    with pytest.raises(StateCodecError) as error:
        encode_rank_state(state)
    assert str(error.value) == (
        "cannot save the Energon rank state: state['datasets'][0]['buffer'][1] is a "
        "test_state_codec.test_a_type_outside_the_allow_list_is_refused_on_save.<locals>.Custom, "
        "which is not in the allow-list of state types (plain JSON values, lists, FlexState, dict, "
        "tuple, bytes, tensor, ndarray, SavableDataLoaderState, SavableDatasetCheckpoint, "
        "SavableDatasetState, SystemRngState, SliceState); a checkpoint holds data only. If an "
        "Energon upgrade or a new dataset wrapper saves this type, add it to "
        "rl_data.energon.state_codec"
    )
    with pytest.raises(StateCodecError, match=r"state\['a'\] is a numpy.ndarray of dtype object"):
        encode_rank_state(FlexState(a=numpy.array([None], dtype=object)))
    with pytest.raises(StateCodecError, match=r"state has the key 1 of type int; state mappings"):
        encode_rank_state({1: 2})


def _workers_state(*states):
    checkpoints = [SavableDatasetCheckpoint(state=state, offset=offset) for offset, state in enumerate(states)]
    return SavableDataLoaderState(worker_states=checkpoints, next_worker_id=1, micro_batch_size=2)


def test_worker_states_in_the_cache_are_encoded_once_into_the_same_bytes():
    kept = FlexState(buffer=[("shard", 1), ("shard", 2)], rng=torch.arange(4), raw=b"\x00\x01")
    fresh = FlexState(buffer=[("shard", 3)])
    state = _workers_state(kept, None, fresh)
    cache = EncodedValueCache()
    cache.add(kept)
    uncached = encode_rank_state(state)
    assert encode_rank_state(state, cache) == uncached
    # the cache holds the JSON of `kept`: a change its owner promised not to make is not seen
    kept["buffer"].append(("shard", 4))
    assert encode_rank_state(state, cache) == uncached != encode_rank_state(state)
    cache.discard(kept)
    assert len(cache) == 0 and encode_rank_state(state, cache) == encode_rank_state(state)


def test_a_state_string_equal_to_the_cache_marker_falls_back_to_a_full_encode():
    kept = FlexState(key="a")
    # the marker of worker 1's cached state, in worker 0's state: found first when searched
    impostor = FlexState(key="\x00rl_data worker state 1")
    state = _workers_state(impostor, kept)
    cache = EncodedValueCache()
    cache.add(kept)
    assert encode_rank_state(state, cache) == encode_rank_state(state)
    assert decode_rank_state(encode_rank_state(state, cache)).worker_states[0].state["key"] == impostor["key"]
    # a cached state may hold another worker's marker: its JSON is joined in, never searched
    holder = FlexState(key="\x00rl_data worker state 1")
    other = FlexState(key="b")
    state = _workers_state(holder, other)
    cache.add(holder)
    cache.add(other)
    assert encode_rank_state(state, cache) == encode_rank_state(state)


class _Costly(DeferredValue):
    """Counts how often it is resolved."""

    __slots__ = ("value", "resolved")

    def __init__(self, value):
        self.value, self.resolved = value, 0

    def resolve(self):
        self.resolved += 1
        return self.value


def test_a_deferred_value_is_saved_resolved_or_left_out_as_none():
    costly = _Costly({"samples": [b"\x01", torch.arange(3)]})
    state = _workers_state(FlexState(cache=costly, keys=[("shard", 1)]))
    complete = _workers_state(FlexState(cache=costly.value, keys=[("shard", 1)]))
    assert encode_rank_state(state) == encode_rank_state(complete) and costly.resolved == 1
    left_out = []
    light = encode_rank_state(state, left_out=left_out)
    assert left_out == [costly] and costly.resolved == 1  # not resolved
    assert light == encode_rank_state(_workers_state(FlexState(cache=None, keys=[("shard", 1)])))
    # a cached worker state is always complete: a light state may splice it, a full one never gets a light one
    cache = EncodedValueCache()
    cache.add(state.worker_states[0].state)
    assert encode_rank_state(state, cache, left_out=[]) == encode_rank_state(complete)
    assert encode_rank_state(state, cache) == encode_rank_state(complete)
    # what an Energon worker sends is pickled: complete, and a snapshot a deep copy keeps as it is
    unpickled = pickle.loads(pickle.dumps(costly))
    assert type(unpickled) is dict and encode_rank_state(unpickled) == encode_rank_state(costly.value)
    assert copy.deepcopy(state).worker_states[0].state["cache"] is costly


def test_a_cached_worker_state_outside_the_allow_list_is_refused_naming_where():
    cache = EncodedValueCache()
    bad = FlexState(a=numpy.array([None], dtype=object))
    cache.add(bad)
    with pytest.raises(StateCodecError, match=r"state\.worker_states\[1\]\.state\['a'\] is a numpy.ndarray of dtype object"):
        encode_rank_state(_workers_state(None, bad), cache)


def _document(state):
    return json.dumps({"codec": CODEC, "state": state}).encode()


@pytest.mark.parametrize(
    ("state", "found"),
    [
        (
            {"$": "os.system", "items": ["touch /tmp/x"]},
            "state is an object tagged 'os.system', expected one of {tags}",
        ),
        ({"items": []}, "state is an object tagged None, expected one of {tags}"),
        (
            {"$": "tuple", "items": [], "x": 1},
            "state is a tuple with keys ['$', 'items', 'x'], expected ['$', 'items']",
        ),
        ([{"$": "tuple", "items": 3}], "state[0] is a tuple whose 'items' is a int, expected list"),
        (
            {"$": "SliceState", "fields": {"index": 0, "current": 1, "extra": 2}},
            "state is a SliceState with fields ['current', 'extra', 'index'], expected "
            "['current', 'index']",
        ),
        (
            {"$": "ndarray", "dtype": "|O", "shape": [1], "b64": ""},
            "state is an array of dtype '|O', expected plain numbers",
        ),
        (
            {"$": "tensor", "dtype": "uint8", "shape": [3], "b64": "AAA="},
            "state is a tensor of shape [3] with 2 bytes",
        ),
        ({"$": "bytes", "b64": "not base64!"}, "state is a bytes with invalid base64 data"),
    ],
    ids=[
        "foreign_tag",
        "untagged",
        "extra_key",
        "wrong_type",
        "fields",
        "object_array",
        "short_tensor",
        "base64",
    ],
)
def test_a_crafted_or_damaged_payload_is_refused_on_load(state, found):
    with pytest.raises(StateCodecError) as error:
        decode_rank_state(_document(state))
    found = found.replace("{tags}", ", ".join(TAGS))
    assert str(error.value) == (
        f"the Energon rank state is damaged or was not written by rl_data: {found}; restore from "
        "another checkpoint"
    )


def test_a_payload_that_is_not_a_codec_document_is_refused():
    with pytest.raises(StateCodecError) as error:
        decode_rank_state(b'{"codec": "other", "state": null}')
    assert str(error.value) == (
        "the Energon rank state is not a rl_data.energon_state/1 document (found ['codec', "
        "'state'], expected keys ['codec', 'state'] with codec 'rl_data.energon_state/1'); it was "
        "saved by another rl_data version or is damaged"
    )
    with pytest.raises(StateCodecError, match=r"is not valid rl_data.energon_state/1 JSON"):
        decode_rank_state(b"\x00\x01")


@pytest.mark.parametrize(
    ("state", "found"),
    [
        ([], "list"),
        (7, "int"),
        ({"$": "FlexState", "items": {}}, "FlexState"),
        ({"$": "SavableDatasetCheckpoint", "fields": {"state": None, "offset": 0}}, "SavableDatasetCheckpoint"),
    ],
    ids=["list", "int", "flex_state", "worker_checkpoint"],
)
def test_a_document_whose_state_is_not_a_loader_state_is_refused_naming_its_type(state, found):
    with pytest.raises(StateCodecError) as error:
        decode_rank_state(_document(state))
    assert str(error.value) == (
        f"the Energon rank state is damaged or was not written by rl_data: state is a {found}, expected a "
        "SavableDataLoaderState or null (the initial state); restore from another checkpoint"
    )


@pytest.mark.timeout(60)
def test_a_loader_refuses_a_state_that_is_not_a_loader_state_before_energon_sees_it(energon_dataset, tokenizer):
    # Energon's restore_state_rank would fail on it with a bare AssertionError()
    crafted = _crafted(make_loader(energon_dataset, tokenizer, **LOADER).state_dict(), _document({"$": "FlexState", "items": {}}))
    with pytest.raises(StateCodecError, match=r"state is a FlexState, expected a SavableDataLoaderState"):
        make_loader(energon_dataset, tokenizer, **LOADER).load_state_dict(crafted)


class _WritesMarker:
    """Unpickling this runs ``exec``: what a crafted checkpoint does."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('pwned')",)


def _crafted(state, payload):
    tensor = torch.frombuffer(bytearray(payload), dtype=torch.uint8).clone()
    return {**state, "loader_state": tensor}


OLD_PICKLE_REFUSAL = (
    "the Energon rank state is a pickle: it was saved by an older rl_data and cannot be loaded "
    "safely (unpickling can run any code); restart from the beginning of the data or from a "
    "checkpoint saved by this rl_data version"
)


@pytest.mark.timeout(60)
def test_a_crafted_checkpoint_is_refused_and_runs_nothing(energon_dataset, tokenizer, tmp_path):
    marker = tmp_path / "marker"
    state = make_loader(energon_dataset, tokenizer, **LOADER).state_dict()
    crafted = _crafted(state, pickle.dumps(_WritesMarker(marker), protocol=pickle.HIGHEST_PROTOCOL))
    file = save_checkpoint_file(tmp_path / "ckpt" / "rl_data_state.pt", {"ranks": [crafted]})
    loaded = load_checkpoint_file(file)["ranks"][0]  # the file itself is data: weights_only
    fresh = make_loader(energon_dataset, tokenizer, **LOADER)
    with pytest.raises(StateCodecError) as error:
        fresh.load_state_dict(loaded)
    assert str(error.value) == OLD_PICKLE_REFUSAL
    assert not marker.exists()
    restored = make_loader(energon_dataset, tokenizer, **LOADER)  # the same envelope with the real state loads
    genuine = load_checkpoint_file(save_checkpoint_file(file, {"ranks": [state]}))["ranks"][0]
    restored.load_state_dict(genuine)


@pytest.mark.timeout(60)
def test_a_state_pickled_by_an_older_rl_data_is_refused(energon_dataset, tokenizer):
    loader = make_loader(energon_dataset, tokenizer, **LOADER)
    batches = iter(loader)
    next(batches)
    old = _crafted(loader.state_dict(), pickle.dumps(loader._stream.energon_state(), protocol=5))
    with pytest.raises(StateCodecError) as error:
        make_loader(energon_dataset, tokenizer, **LOADER).load_state_dict(old)
    assert str(error.value) == OLD_PICKLE_REFUSAL
