"""Loader identity: fingerprint, brief reprs, exact diff lines, topology, identity keys."""

from __future__ import annotations

import hashlib
import json

import pytest
from energon_fixtures import make_loader

from rl_data.energon.config import EnergonLoaderConfig, EnergonSourceConfig
from rl_data.energon.identity import _loader_identity, _v2_topology, restore_differences
from rl_data.energon.task_encoders import ProcessorAdapter
from rl_data.fingerprint import brief, differences, fingerprint

ADAPTER = {"max_sequence_length": 512, "add_bos": True, "fingerprint": "f" * 64}


def test_fingerprint_is_sha256_of_sorted_json():
    identity = {"b": [1, 2], "a": {"y": None, "x": "s"}}
    expected = hashlib.sha256(b'{"a": {"x": "s", "y": null}, "b": [1, 2]}').hexdigest()
    assert fingerprint(identity) == expected
    assert fingerprint({"a": {"y": None, "x": "s"}, "b": [1, 2]}) == expected
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})


def test_brief_cuts_long_reprs_to_80_characters():
    assert brief("train") == "'train'"
    assert brief(None) == "None"
    assert brief("x" * 78) == "'" + "x" * 78 + "'"  # exactly 80 characters
    long = brief("x" * 79)
    assert len(long) == 80 and long == "'" + "x" * 76 + "..."


def test_differences_exact_lines():
    saved = {
        "loader": {"num_workers": 4, "shuffle_buffer_size": 100},
        "split_role": "train",
        "x": 1,
        "topology": {"logical_rank": 0},
    }
    current = {
        "loader": {"num_workers": 2, "shuffle_buffer_size": 100},
        "split_role": "validation",
        "topology": {"logical_rank": 0, "y": [1, 2]},
    }
    assert differences(saved, current) == [
        "loader.num_workers 4 -> 2",
        "split_role 'train' -> 'validation'",
        "topology.y added [1, 2]",
        "x removed 1",
    ]
    assert differences(current, saved) == [
        "loader.num_workers 2 -> 4",
        "split_role 'validation' -> 'train'",
        "topology.y removed [1, 2]",
        "x added 1",
    ]


def test_differences_of_equal_values_and_of_types():
    assert differences({"a": {"b": [1]}}, {"a": {"b": [1]}}) == []
    assert differences({"a": 1}, {"a": True}) == ["a 1 -> True"]
    assert differences({"a": {"b": 1}}, {"a": 5}) == ["a {'b': 1} -> 5"]
    assert differences({"adapter": "a" * 100}, {"adapter": "b"}) == [
        "adapter '" + "a" * 76 + "... -> 'b'"
    ]
    assert differences(1, 2, "root") == ["root 1 -> 2"]


def test_v2_topology():
    config = EnergonLoaderConfig(num_workers=2)
    assert _v2_topology(
        loader_config=config, placement_fingerprint="abc", logical_rank=1, logical_world_size=4
    ) == {
        "mapper": {"kind": "energon_contiguous_ranges", "slices": 8},
        "placement": "abc",
        "logical_rank": 1,
        "logical_world_size": 4,
    }
    zero_workers = EnergonLoaderConfig(num_workers=0)
    topology = _v2_topology(
        loader_config=zero_workers, placement_fingerprint="p", logical_rank=0, logical_world_size=3
    )
    assert topology["mapper"]["slices"] == 3


def _identity(path, *, packing_algorithm=None, **overrides):
    arguments = dict(
        source=EnergonSourceConfig(path=str(path), split="train", virtual_epoch_length=5),
        loader_config=EnergonLoaderConfig(),
        adapter=ADAPTER,
        split_role="train",
        batch_size=4,
        shuffle=True,
        topology={"mapper": "m", "placement": "p", "logical_rank": 0, "logical_world_size": 1},
        packing_algorithm=packing_algorithm,
        max_sequences_per_bin=None,
        sequence_length_pad_multiple=8,
        only_unmask_final=False,
    )
    arguments.update(overrides)
    return _loader_identity(**arguments)


def test_loader_identity_without_packing(energon_dataset):
    identity = _identity(energon_dataset.path)
    uuid = (energon_dataset.root / ".nv-meta" / "index.uuid").read_text()
    assert identity == {
        "source": {
            "path": energon_dataset.path,
            "split": "train",
            "virtual_epoch_length": 5,
            "limit": None,
            "epoch_mode": "exact",
        },
        "dataset": {"index_uuid": uuid},
        "loader": EnergonLoaderConfig().identity_dump(),
        "adapter": ADAPTER,
        "split_role": "train",
        "batch_size": 4,
        "shuffle": True,
        "state_format_version": 2,
        "topology": {"mapper": "m", "placement": "p", "logical_rank": 0, "logical_world_size": 1},
    }
    assert json.loads(json.dumps(identity)) == identity
    # without packing, the packing arguments do not matter
    assert (
        _identity(energon_dataset.path, only_unmask_final=True, max_sequences_per_bin=3) == identity
    )


def test_loader_identity_with_packing_adds_the_four_packing_keys(energon_dataset):
    identity = _identity(
        energon_dataset.path, packing_algorithm="first_fit_decreasing", max_sequences_per_bin=3
    )
    plain = _identity(energon_dataset.path)
    assert differences(plain, identity) == [
        "max_sequences_per_bin added 3",
        "only_unmask_final added False",
        "packing_algorithm added 'first_fit_decreasing'",
        "sequence_length_pad_multiple added 8",
    ]


def test_loader_identity_of_a_path_without_index_uuid(tmp_path):
    assert _identity(tmp_path)["dataset"] == {"index_uuid": None}


@pytest.mark.parametrize("value", [{"a": {1, 2}}, {"a": object()}])
def test_fingerprint_requires_plain_json(value):
    with pytest.raises(TypeError):
        fingerprint(value)


def test_adapter_summary_names_every_field_and_its_fingerprint(tokenizer):
    adapter = ProcessorAdapter(tokenizer=tokenizer, max_sequence_length=512)
    template_sha = hashlib.sha256(tokenizer.chat_template.encode()).hexdigest()
    assert adapter.identity_summary == {
        "tokenizer": "qwen3",
        "vocab_size": 151669,
        "vocab_sha256": adapter.identity["vocab_sha256"],
        "chat_template_sha256": template_sha,
        "max_sequence_length": 512,
        "add_bos": True,
        "add_eos": True,
        "add_generation_prompt": False,
        "fingerprint": adapter.fingerprint,
    }
    longer = ProcessorAdapter(tokenizer=tokenizer, max_sequence_length=1024)
    saved = _identity("p", adapter=adapter.identity_summary)
    current = _identity("p", adapter=longer.identity_summary)
    assert restore_differences(saved, current) == ["adapter.max_sequence_length 512 -> 1024"]


def test_restore_differences_list_the_adapter_fingerprint_only_when_nothing_explains_it():
    saved = _identity("p", adapter={**ADAPTER, "fingerprint": "a" * 64})
    assert restore_differences(saved, _identity("p")) == [
        f"adapter.fingerprint {'a' * 64!r} -> {'f' * 64!r}"
    ]


def _with_dataset(identity, *, path, uuid):
    source = {**identity["source"], "path": path}
    return {**identity, "source": source, "dataset": {"index_uuid": uuid}}


def test_a_copy_of_the_dataset_at_another_path_restores_other_content_does_not(tmp_path):
    base = _identity(tmp_path)
    saved = _with_dataset(base, path="/old/data", uuid="u1")
    assert restore_differences(saved, _with_dataset(base, path="/new/data", uuid="u1")) == []
    assert restore_differences(saved, _with_dataset(base, path="/new/data", uuid="u2")) == [
        "dataset.index_uuid 'u1' -> 'u2'",
        "source.path '/old/data' -> '/new/data'",
    ]
    without_uuid = _with_dataset(base, path="/old/data", uuid=None)
    assert restore_differences(without_uuid, _with_dataset(base, path="/new/data", uuid=None)) == [
        "source.path '/old/data' -> '/new/data'"
    ]
    moved_and_changed = _with_dataset(base, path="/new/data", uuid="u1")
    moved_and_changed["source"]["split"] = "val"
    assert restore_differences(saved, moved_and_changed) == ["source.split 'train' -> 'val'"]
    assert restore_differences(None, base) == [f"<identity> None -> {brief(base)}"]
    malformed = restore_differences({**saved, "source": "x"}, base)  # a damaged saved identity
    assert f"source 'x' -> {brief(base['source'])}" in malformed


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (dict(max_sequence_length=1024), "adapter.max_sequence_length 512 -> 1024"),
        (dict(data_config={"add_eos": False}), "adapter.add_eos True -> False"),
    ],
    ids=["max_sequence_length", "add_eos"],
)
def test_a_loader_refusal_names_the_adapter_field_that_changed(
    energon_dataset, tokenizer, overrides, line
):
    state = make_loader(energon_dataset, tokenizer).state_dict()
    with pytest.raises(ValueError) as error:
        make_loader(energon_dataset, tokenizer, **overrides).load_state_dict(state)
    assert str(error.value) == f"Energon loader identity changed: {line}"


def test_a_fingerprint_that_does_not_match_its_identity_is_refused(energon_dataset, tokenizer):
    state = make_loader(energon_dataset, tokenizer).state_dict()
    edited = {**state, "fingerprint": "0" * 64}
    with pytest.raises(ValueError) as error:
        make_loader(energon_dataset, tokenizer).load_state_dict(edited)
    assert str(error.value) == (
        f"Energon loader identity changed: fingerprint {'0' * 64!r} -> {state['fingerprint']!r}"
    )
