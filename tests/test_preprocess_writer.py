"""The staged, atomic output folder, shard cutting, the order guard and token statistics."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from preprocess_fixtures import read_quarantine, read_shards

from rl_data.preprocess.transform import OUTPUT_SCHEMA, sample_key
from rl_data.preprocess.writer import (
    DatasetWriter,
    FailedRowsBudgetExceeded,
    FailureBudget,
    staged_output,
    token_statistics,
)


def rows(file: str, accepted: list[bool], start: int = 0, payload_size: int = 10) -> pa.Table:
    n = len(accepted)
    return pa.Table.from_pydict({
        "file": [file] * n, "row": list(range(start, start + n)),
        "key": [sample_key(file, r) for r in range(start, start + n)], "accepted": accepted,
        "kind": ["sft" if a else "" for a in accepted],
        "payload": [b'{"kind":"sft","n":"' + b"x" * payload_size + b'"}' if a else b"" for a in accepted],
        "media": [[] for _ in accepted],
        "num_tokens": [5 if a else -1 for a in accepted],
        "reason": ["" if a else "empty_content" for a in accepted],
        "message": ["" if a else "content is empty" for a in accepted],
        "raw": ["" if a else "{}" for a in accepted],
        "content_hash": [start + i if a else 0 for i, a in enumerate(accepted)],
    }, schema=OUTPUT_SCHEMA)


def test_staged_output_publishes_only_on_success(tmp_path):
    output = tmp_path / "ds"
    with pytest.raises(RuntimeError, match="boom"), staged_output(output, overwrite=False) as staging:
        (staging / "half.tar").write_bytes(b"x")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with staged_output(output, overwrite=False) as staging:
        (staging / "done").write_text("1")
    assert [p.name for p in tmp_path.iterdir()] == ["ds"] and (output / "done").read_text() == "1"


def test_staged_output_refuses_existing_output_unless_overwrite(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "old").write_text("old")
    with pytest.raises(FileExistsError, match=r"output .*ds already exists; pass overwrite=True \(--overwrite\)"):
        with staged_output(tmp_path / "ds", overwrite=False):
            pass
    with staged_output(tmp_path / "ds", overwrite=True) as staging:
        (staging / "new").write_text("new")
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == ["new"]
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]


def test_shards_are_cut_by_rows_and_quarantine_keeps_order(tmp_path):
    writer = DatasetWriter(tmp_path, target_shard_bytes=1 << 30, target_shard_rows=3)
    writer.add_batch(rows("a.jsonl", [True, False, True, True]))
    writer.add_batch(rows("b.jsonl", [True, True, False]))
    stats = writer.close()
    assert [(s.path, s.samples) for s in stats.shards] == [("shards/train-000000.tar", 3),
                                                          ("shards/train-000001.tar", 2)]
    assert (stats.read, stats.accepted, stats.quarantined_by_reason) == (7, 5, {"empty_content": 2})
    assert list(read_shards(tmp_path)) == [sample_key("a.jsonl", r) for r in (0, 2, 3)] + [
        sample_key("b.jsonl", r) for r in (0, 1)]
    assert [(q["file"], q["row"], q["reason"]) for q in read_quarantine(tmp_path)] == [
        ("a.jsonl", 1, "empty_content"), ("b.jsonl", 2, "empty_content")]


def test_shards_are_cut_by_bytes(tmp_path):
    writer = DatasetWriter(tmp_path, target_shard_bytes=3000, target_shard_rows=None)
    writer.add_batch(rows("a.jsonl", [True] * 5, payload_size=500))
    assert [s.samples for s in writer.close().shards] == [2, 2, 1]


def test_out_of_order_rows_are_refused(tmp_path):
    writer = DatasetWriter(tmp_path, target_shard_bytes=1 << 30, target_shard_rows=None)
    writer.add_batch(rows("b.jsonl", [True]))
    with pytest.raises(RuntimeError, match=r"rows reached the writer out of order: \('a.jsonl', 0\) after \('b.jsonl', 0\)"):
        writer.add_batch(rows("a.jsonl", [True]))


def test_token_statistics_are_exact_nearest_rank():
    lengths = np.array([3, 7, 7, 10, 100] * 4)
    stats = token_statistics(np.bincount(lengths))
    assert stats == {"count": 20, "min": 3, "mean": 25.4, "p50": 7, "p95": 100, "max": 100}
    assert token_statistics(np.zeros(0, dtype=np.int64))["count"] == 0


def test_samples_go_to_per_split_shards_and_duplicates_are_counted(tmp_path):
    writer = DatasetWriter(tmp_path, target_shard_bytes=1 << 30, target_shard_rows=2,
                           splits={"train": 0.5, "val": 0.25, "test": 0.25})
    batch = rows("a.jsonl", [True] * 8).set_column(
        OUTPUT_SCHEMA.get_field_index("content_hash"), "content_hash", pa.array([1, 2, 1, 3, 4, 2, 5, 6], pa.int64()))
    writer.add_batch(batch)
    stats = writer.close()
    assert [(s.path, s.samples) for s in stats.shards] == [
        ("shards/train-000000.tar", 2), ("shards/val-000000.tar", 2), ("shards/test-000000.tar", 2),
        ("shards/train-000001.tar", 2)]
    assert stats.duplicates == 2


def test_too_long_rows_do_not_count_against_the_failed_rows_budget(tmp_path):
    writer = DatasetWriter(tmp_path, target_shard_bytes=1 << 30, target_shard_rows=None,
                           budget=FailureBudget(max_fraction=0.0, max_rows=1))
    batch = rows("a.jsonl", [False] * 3)
    writer.add_batch(batch.set_column(OUTPUT_SCHEMA.get_field_index("reason"), "reason", pa.array(["too_long"] * 3)))
    writer.add_batch(rows("a.jsonl", [False], start=3))
    with pytest.raises(FailedRowsBudgetExceeded, match=r"2 of the first 5 rows failed \(empty_content: 2\)"):
        writer.add_batch(rows("a.jsonl", [False], start=4))
