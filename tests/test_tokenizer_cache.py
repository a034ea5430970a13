"""tokenizer_cache: entries are written whole or not at all, and a broken cache is never fatal."""

from __future__ import annotations

import os

from rl_data.tokenization import tokenizer_cache
from rl_data.tokenization.tokenizer_cache import read_entry, write_entry


def test_an_entry_is_written_whole_and_read_back(tmp_path):
    entry = tmp_path / "kind" / "key"
    write_entry(entry, "abc " * 1000)
    assert read_entry(entry) == ("abc " * 1000).strip()
    assert os.listdir(entry.parent) == ["key"]


def test_a_failed_write_leaves_neither_the_entry_nor_a_partial_file(tmp_path, monkeypatch):
    entry = tmp_path / "kind" / "key"

    def full_disk(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tokenizer_cache.os, "replace", full_disk)
    write_entry(entry, "x" * 10_000)  # skipped, not raised
    assert read_entry(entry) is None and os.listdir(entry.parent) == []


def test_a_cache_that_cannot_be_created_is_skipped(tmp_path):
    (tmp_path / "kind").write_text("a file where the folder should be")
    write_entry(tmp_path / "kind" / "key", "1")
    assert read_entry(tmp_path / "kind" / "key") is None
