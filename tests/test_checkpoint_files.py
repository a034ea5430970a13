"""Atomic, checksummed checkpoint files: round trip, weights_only loading, refusal of damage."""

from __future__ import annotations

import os

import pytest
import torch

from rl_data.distributed.checkpoint_files import (
    CheckpointFileError,
    checkpoint_path,
    content_digest,
    load_checkpoint_file,
    pickled_size,
    save_checkpoint_file,
)


def _content():
    return {
        "step": 7,
        "placement": {"fingerprint": "ab" * 32, "layout": {"strategy": "PACK", "bundles": [{"CPU": 1.0}]}},
        "ranks": [
            {"backend": "energon", "format_version": 2, "loader_state": torch.arange(5, dtype=torch.uint8)},
            {"backend": "energon", "format_version": 2, "loader_state": torch.tensor([], dtype=torch.uint8)},
        ],
        "misc": (1.5, None, True, "x"),
    }


def test_round_trip_is_exact_and_loads_with_weights_only(tmp_path):
    path = save_checkpoint_file(checkpoint_path(tmp_path / "step_7"), _content())
    assert path == tmp_path / "step_7" / "rl_data_state.pt"
    assert [p.name for p in path.parent.iterdir()] == ["rl_data_state.pt"]  # no temp left over
    raw = torch.load(path, weights_only=True)
    assert raw["format"] == "rl_data.checkpoint" and raw["format_version"] == 1
    assert raw["sha256"] == content_digest(_content())
    loaded = load_checkpoint_file(path)
    assert loaded["step"] == 7 and loaded["misc"] == (1.5, None, True, "x")
    assert loaded["placement"] == _content()["placement"]
    assert torch.equal(loaded["ranks"][0]["loader_state"], torch.arange(5, dtype=torch.uint8))
    assert loaded["ranks"][1]["loader_state"].dtype == torch.uint8


def test_digest_distinguishes_types_values_and_order():
    base = content_digest(_content())
    assert content_digest(_content()) == base
    changed = _content()
    changed["ranks"][0]["loader_state"][2] = 99
    assert content_digest(changed) != base
    assert content_digest({"a": 1}) != content_digest({"a": 1.0})
    assert content_digest({"a": 1}) != content_digest({"a": "1"})
    assert content_digest({"a": [1, 2]}) != content_digest({"a": (1, 2)})
    assert content_digest({"a": [1, 2]}) != content_digest({"a": [2, 1]})
    assert content_digest(torch.zeros(2, dtype=torch.int16)) != content_digest(torch.zeros(4, dtype=torch.int8))


def test_unsupported_value_is_refused_with_its_location(tmp_path):
    with pytest.raises(TypeError, match=r"checkpoint value at content\.ranks\[0\]\.x is a set"):
        save_checkpoint_file(tmp_path / "c.pt", {"ranks": [{"x": {1}}]})
    assert list(tmp_path.iterdir()) == []


def test_bytes_round_trip_and_empty_bytes_are_refused_before_anything_is_written(tmp_path):
    """torch pickles b"" as a call of ``bytes`` that ``weights_only`` refuses to load: refused at save."""
    path = save_checkpoint_file(tmp_path / "b.pt", {"history": {"keys": bytes(range(256)), "records": b"\x00" * 8}})
    assert load_checkpoint_file(path)["history"] == {"keys": bytes(range(256)), "records": b"\x00" * 8}
    assert content_digest({"a": b"1"}) != content_digest({"a": "1"})
    with pytest.raises(TypeError, match=r"checkpoint value at content\.history\.keys is empty bytes, which torch.load\(weights_only=True\) cannot read"):
        save_checkpoint_file(tmp_path / "empty" / "c.pt", {"history": {"keys": b""}})
    assert not (tmp_path / "empty" / "c.pt").exists()


def test_overwrite_replaces_atomically(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint_file(path, {"step": 1})
    save_checkpoint_file(path, {"step": 2})
    assert load_checkpoint_file(path) == {"step": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


@pytest.mark.parametrize("keep_fraction", [0.0, 0.5, 0.95])
def test_truncated_file_is_refused(tmp_path, keep_fraction):
    path = save_checkpoint_file(tmp_path / "c.pt", _content())
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep_fraction)])
    size = int(len(data) * keep_fraction)
    with pytest.raises(CheckpointFileError, match=rf"checkpoint file {path} \({size} bytes\) cannot be read, it is truncated or corrupt"):
        load_checkpoint_file(path)


def test_altered_content_fails_the_checksum(tmp_path):
    path = tmp_path / "c.pt"
    record = {"format": "rl_data.checkpoint", "format_version": 1, "sha256": content_digest({"step": 1}), "content": {"step": 2}}
    torch.save(record, path)
    with pytest.raises(CheckpointFileError, match=r"fails its checksum \(stored sha256 [0-9a-f]{64}, content hashes to [0-9a-f]{64}\)"):
        load_checkpoint_file(path)


def test_foreign_file_and_other_version_are_refused(tmp_path):
    torch.save({"model": torch.zeros(1)}, tmp_path / "a.pt")
    with pytest.raises(CheckpointFileError, match=r"is not an rl_data checkpoint: format None, expected 'rl_data.checkpoint'"):
        load_checkpoint_file(tmp_path / "a.pt")
    torch.save({"format": "rl_data.checkpoint", "format_version": 9, "sha256": "", "content": {}}, tmp_path / "b.pt")
    with pytest.raises(CheckpointFileError, match=r"file format version 9; this version of rl_data reads version 1"):
        load_checkpoint_file(tmp_path / "b.pt")


def test_missing_file_is_an_error_not_a_fresh_start(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no rl_data checkpoint file at .*rl_data_state\.pt"):
        load_checkpoint_file(checkpoint_path(tmp_path / "nowhere"))


def test_failed_write_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch):
    path = save_checkpoint_file(tmp_path / "c.pt", {"step": 1})

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint_file(path, {"step": 2})
    monkeypatch.undo()
    assert load_checkpoint_file(path) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def _assert_same_content(loaded, expected):
    assert loaded.keys() == expected.keys()
    assert {k: v for k, v in loaded.items() if k != "ranks"} == {
        k: v for k, v in expected.items() if k != "ranks"
    }
    for got, want in zip(loaded["ranks"], expected["ranks"], strict=True):
        assert got.keys() == want.keys() and torch.equal(got["loader_state"], want["loader_state"])


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore::UserWarning")  # torch warns about flipped protocol bytes
def test_a_bit_flip_anywhere_is_refused_or_harmless(tmp_path):
    path = save_checkpoint_file(tmp_path / "c.pt", _content())
    data = path.read_bytes()
    key_offset = data.index(b"content")
    assert key_offset < len(data)  # the record's keys are inside the flipped range
    outcomes = {"refused": 0, "harmless": 0}
    for offset in range(len(data)):
        damaged = bytearray(data)
        damaged[offset] ^= 1 << (offset % 8)
        path.write_bytes(damaged)
        try:
            loaded = load_checkpoint_file(path)
        except CheckpointFileError:
            outcomes["refused"] += 1
        else:  # zip padding and directory fields torch does not read
            _assert_same_content(loaded, _content())
            outcomes["harmless"] += 1
    assert outcomes["refused"] > len(data) // 4, outcomes


def _write_record(path, record):
    torch.save(record, path)
    return path


def test_a_renamed_record_key_is_refused_with_what_was_found(tmp_path):
    content = {"step": 1}
    record = {"format": "rl_data.checkpoint", "format_version": 1, "sha256": content_digest(content), "contenu": content}
    path = _write_record(tmp_path / "c.pt", record)
    with pytest.raises(CheckpointFileError) as error:
        load_checkpoint_file(path)
    assert str(error.value) == (
        f"checkpoint file {path} is damaged: its record has keys ['contenu', 'format', "
        "'format_version', 'sha256'], expected ['content', 'format', 'format_version', 'sha256']; "
        "restore from another checkpoint"
    )


@pytest.mark.parametrize(
    ("key", "value", "found"),
    [("sha256", None, "NoneType"), ("content", [1], "list"), ("format_version", True, None)],
)
def test_a_record_value_of_the_wrong_type_is_refused(tmp_path, key, value, found):
    content = {"step": 1}
    record = {"format": "rl_data.checkpoint", "format_version": 1, "sha256": content_digest(content), "content": content}
    record[key] = value
    path = _write_record(tmp_path / "c.pt", record)
    with pytest.raises(CheckpointFileError) as error:
        load_checkpoint_file(path)
    expected = {"sha256": "str", "content": "dict", "format_version": "int"}[key]
    assert str(error.value) == (
        f"checkpoint file {path} is damaged: its record's {key!r} is of type {found or 'bool'}, "
        f"expected {expected}; restore from another checkpoint"
    )


def test_content_holding_a_value_no_checkpoint_holds_is_refused(tmp_path):
    record = {"format": "rl_data.checkpoint", "format_version": 1, "sha256": "0" * 64, "content": {"ranks": [{3: 1}]}}
    path = _write_record(tmp_path / "c.pt", record)
    with pytest.raises(CheckpointFileError) as error:
        load_checkpoint_file(path)
    assert str(error.value) == (
        f"checkpoint file {path} is damaged: checkpoint key 3 at content.ranks[0] is not a str; "
        "restore from another checkpoint"
    )


def test_pickled_size_counts_the_bytes_pickle_writes():
    import pickle

    content = {"step": 3, "history": b"\x01" * 100_000, "ranks": [{"epoch": 1, "ids": list(range(50))}]}
    assert pickled_size(content) == len(pickle.dumps(content, protocol=pickle.HIGHEST_PROTOCOL)) > 100_000
