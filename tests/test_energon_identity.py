"""Loader identity: fingerprint, brief reprs, exact diff lines, topology, identity keys."""

from __future__ import annotations

import hashlib
import json

import pytest

from rl_data.energon.config import EnergonLoaderConfig, EnergonSourceConfig
from rl_data.energon.identity import (
    _brief,
    _identity_differences,
    _identity_fingerprint,
    _loader_identity,
    _v2_topology,
)


def test_fingerprint_is_sha256_of_sorted_json():
    identity = {"b": [1, 2], "a": {"y": None, "x": "s"}}
    expected = hashlib.sha256(b'{"a": {"x": "s", "y": null}, "b": [1, 2]}').hexdigest()
    assert _identity_fingerprint(identity) == expected
    assert _identity_fingerprint({"a": {"y": None, "x": "s"}, "b": [1, 2]}) == expected
    assert _identity_fingerprint({"a": 1}) != _identity_fingerprint({"a": 2})


def test_brief_cuts_long_reprs_to_80_characters():
    assert _brief("train") == "'train'"
    assert _brief(None) == "None"
    assert _brief("x" * 78) == "'" + "x" * 78 + "'"  # exactly 80 characters
    long = _brief("x" * 79)
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
    assert _identity_differences(saved, current) == [
        "loader.num_workers 4 -> 2",
        "split_role 'train' -> 'validation'",
        "topology.y added [1, 2]",
        "x removed 1",
    ]
    assert _identity_differences(current, saved) == [
        "loader.num_workers 2 -> 4",
        "split_role 'validation' -> 'train'",
        "topology.y removed [1, 2]",
        "x added 1",
    ]


def test_differences_of_equal_values_and_of_types():
    assert _identity_differences({"a": {"b": [1]}}, {"a": {"b": [1]}}) == []
    assert _identity_differences({"a": 1}, {"a": True}) == ["a 1 -> True"]
    assert _identity_differences({"a": {"b": 1}}, {"a": 5}) == ["a {'b': 1} -> 5"]
    assert _identity_differences({"adapter": "a" * 100}, {"adapter": "b"}) == [
        "adapter '" + "a" * 76 + "... -> 'b'"
    ]
    assert _identity_differences(1, 2, "root") == ["root 1 -> 2"]


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
        adapter_fingerprint="f" * 64,
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
        },
        "dataset": {"index_uuid": uuid},
        "loader": EnergonLoaderConfig().identity_dump(),
        "adapter": "f" * 64,
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
    assert _identity_differences(plain, identity) == [
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
        _identity_fingerprint(value)
