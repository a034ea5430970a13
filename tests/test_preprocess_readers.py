"""Input resolution and row streaming for JSONL, JSON arrays and Parquet (no Ray needed)."""

from __future__ import annotations

import hashlib
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from preprocess_fixtures import write_jsonl

from rl_data.preprocess.readers import InputFile, file_identity, peek_rows, resolve_inputs, stream_file_rows


def rows_of(file: InputFile, rows_per_block: int = 1024) -> list[tuple[str, int, str]]:
    return [(t["file"][i].as_py(), t["row"][i].as_py(), t["raw"][i].as_py())
            for t in stream_file_rows(file, rows_per_block) for i in range(t.num_rows)]


def test_jsonl_rows_keep_line_index_and_skip_blank_lines(tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", [{"a": 1}, "", "not json", {"b": "é"}])
    (file,) = resolve_inputs([str(path)])
    assert file == InputFile(uri=str(path), name="chat.jsonl", format="jsonl")
    assert rows_of(file) == [("chat.jsonl", 0, '{"a": 1}'), ("chat.jsonl", 2, "not json"),
                             ("chat.jsonl", 3, '{"b": "é"}')]


def test_blocks_have_at_most_rows_per_block_rows(tmp_path):
    path = write_jsonl(tmp_path / "many.jsonl", [{"i": i} for i in range(10)])
    blocks = list(stream_file_rows(resolve_inputs([str(path)])[0], rows_per_block=4))
    assert [b.num_rows for b in blocks] == [4, 4, 2]
    assert blocks[2]["row"].to_pylist() == [8, 9]


def test_json_array_and_parquet(tmp_path):
    (tmp_path / "arr.json").write_text(json.dumps([{"x": 1}, {"x": 2}, [3]]))
    pq.write_table(pa.table({"prompt": ["a", "b"], "blob": [b"\x00\x01", None]}), tmp_path / "t.parquet")
    files = resolve_inputs([str(tmp_path)])
    assert [(f.name, f.format) for f in files] == [("arr.json", "json"), ("t.parquet", "parquet")]
    assert rows_of(files[0]) == [("arr.json", 0, '{"x": 1}'), ("arr.json", 1, '{"x": 2}'), ("arr.json", 2, "[3]")]
    assert rows_of(files[1]) == [("t.parquet", 0, '{"prompt": "a", "blob": {"__bytes__": "AAE=", "size": 2}}'),
                                 ("t.parquet", 1, '{"prompt": "b", "blob": null}')]


def test_glob_names_are_relative_to_the_common_folder(tmp_path):
    for name in ("a/x.jsonl", "a/sub/y.jsonl", "b/z.jsonl", "b/notes.txt"):
        write_jsonl(tmp_path / name, [{"i": 1}])
    files = resolve_inputs([str(tmp_path / "**" / "*.jsonl"), str(tmp_path / "a" / "x.jsonl")])
    assert [f.name for f in files] == ["a/sub/y.jsonl", "a/x.jsonl", "b/z.jsonl"]


def test_missing_input_and_unknown_extension(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"input '.*nothing-\*\.jsonl' matches no file"):
        resolve_inputs([str(tmp_path / "nothing-*.jsonl")])
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"cannot tell the format of .*data\.csv' from its extension '\.csv'"):
        resolve_inputs([str(tmp_path / "data.csv")])
    assert resolve_inputs([str(tmp_path / "data.csv")], "jsonl")[0].format == "jsonl"


def test_malformed_json_array_names_the_file(tmp_path):
    (tmp_path / "broken.json").write_text('[{"a": 1},')
    with pytest.raises(ValueError, match=r"broken\.json looks like a JSON array but does not parse"):
        rows_of(resolve_inputs([str(tmp_path / "broken.json")])[0])


def test_peek_rows_spans_files(tmp_path):
    write_jsonl(tmp_path / "1.jsonl", [{"i": 0}])
    write_jsonl(tmp_path / "2.jsonl", [{"i": 1}, {"i": 2}])
    peeked = peek_rows(resolve_inputs([str(tmp_path)]), limit=2)
    assert [(f.name, row, raw) for f, row, raw in peeked] == [("1.jsonl", 0, '{"i": 0}'), ("2.jsonl", 0, '{"i": 1}')]


def test_file_identity(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"i": 0}])
    identity = file_identity(resolve_inputs([str(path)])[0])
    assert identity == {"path": str(path), "name": "d.jsonl", "size": path.stat().st_size,
                        "mtime_ns": os.stat(path).st_mtime_ns,
                        "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
