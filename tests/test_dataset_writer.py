"""The Energon dataset writer: deterministic shards, per-shard splits, content-derived uuid."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import pytest

from energon_fixtures import chat_members, sample_key
from rl_data.energon.dataset_writer import (
    assign_splits,
    write_energon_dataset,
    write_tar_shard,
)


def _samples(conversations, count):
    return [(sample_key(c, i), chat_members(c, i)) for i, c in enumerate(conversations[:count])]


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.glob("shards/*.tar"))
    }


def test_two_writes_of_the_same_samples_give_identical_bytes_and_uuid(tmp_path, chat_conversations):
    samples = _samples(chat_conversations, 30)
    first = write_energon_dataset(tmp_path / "a", samples, samples_per_shard=3)
    second = write_energon_dataset(tmp_path / "b", samples, samples_per_shard=3)
    assert first == second
    assert len(_digests(tmp_path / "a")) == 10
    assert _digests(tmp_path / "a") == _digests(tmp_path / "b")
    uuid_a = (tmp_path / "a" / ".nv-meta" / "index.uuid").read_text()
    assert uuid_a == (tmp_path / "b" / ".nv-meta" / "index.uuid").read_text()


def test_index_uuid_changes_when_one_sample_changes(tmp_path, chat_conversations):
    samples = _samples(chat_conversations, 30)
    write_energon_dataset(tmp_path / "a", samples, samples_per_shard=3)
    changed = list(samples)
    changed[17] = (changed[17][0], chat_members(chat_conversations[40], 17))
    write_energon_dataset(tmp_path / "b", changed, samples_per_shard=3)
    uuid_a = (tmp_path / "a" / ".nv-meta" / "index.uuid").read_text()
    uuid_b = (tmp_path / "b" / ".nv-meta" / "index.uuid").read_text()
    assert uuid_a != uuid_b
    differing = {k for k, v in _digests(tmp_path / "a").items() if _digests(tmp_path / "b")[k] != v}
    assert differing == {"shards/shard-000005.tar"}


def test_splits_are_assigned_per_shard_in_order(tmp_path, chat_conversations):
    samples = _samples(chat_conversations, 20)
    splits = write_energon_dataset(tmp_path, samples, samples_per_shard=2)
    assert splits == {
        "train": [f"shards/shard-{i:06d}.tar" for i in range(8)],
        "val": ["shards/shard-000008.tar"],
        "test": ["shards/shard-000009.tar"],
    }
    split_yaml = (tmp_path / ".nv-meta" / "split.yaml").read_text()
    assert "shard-000008" in split_yaml and "shard-000009" in split_yaml
    assert (tmp_path / ".nv-meta" / "dataset.yaml").read_text().endswith("CrudeWebdataset\n")
    for shard in splits["train"]:
        assert (tmp_path / (shard + ".idx")).is_file()


def test_a_split_that_would_be_empty_is_refused_before_writing_meta(tmp_path, chat_conversations):
    samples = _samples(chat_conversations, 9)
    with pytest.raises(ValueError) as error:
        write_energon_dataset(tmp_path, samples, samples_per_shard=3)
    assert str(error.value) == (
        "split ratios {'train': 0.8, 'val': 0.1, 'test': 0.1} with 3 shard(s) leave split(s) "
        "['val', 'test'] empty (splits are assigned per shard); write at least 10 shards "
        "(smaller target shard size) or drop those splits"
    )
    assert not (tmp_path / ".nv-meta").exists()


@pytest.mark.parametrize(
    ("num_shards", "ratios", "expected"),
    [
        (
            10,
            {"train": 0.8, "val": 0.1, "test": 0.1},
            {"train": list(range(8)), "val": [8], "test": [9]},
        ),
        (3, {"train": 1.0}, {"train": [0, 1, 2]}),
        (5, {"train": 0.5, "val": 0.5, "test": 0.0}, {"train": [0, 1, 2], "val": [3, 4]}),
    ],
)
def test_assign_splits(num_shards, ratios, expected):
    assert assign_splits(num_shards, ratios) == expected


def test_tar_members_are_sorted_with_zero_mtime(tmp_path):
    count = write_tar_shard(tmp_path / "s.tar", [("k1", {"json": b"{}", "a.txt": b"x"})])
    assert count == 1
    with tarfile.open(tmp_path / "s.tar") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["k1.a.txt", "k1.json"]
    assert {m.mtime for m in members} == {0}


def test_invalid_key_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"sample key 'a\.b' is not a valid WebDataset key"):
        write_tar_shard(tmp_path / "s.tar", [("a.b", {"json": b"{}"})])
