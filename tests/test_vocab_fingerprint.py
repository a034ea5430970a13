"""The vocabulary fingerprint of the loader identity, and its disk cache."""

from __future__ import annotations

import pytest

from rl_data.tokenization.tokenizer import load_qwen3_tokenizer
from rl_data.tokenization.vocab_fingerprint import full_vocab_fingerprint, vocab_fingerprint


@pytest.fixture()
def cache(fresh_cache):
    """The fingerprint folder of a cache of this test's own (the tokenizer folder copied in)."""
    return fresh_cache / "vocab_fingerprints"


def test_a_fresh_tokenizer_reads_the_fingerprint_from_disk(cache):
    first = load_qwen3_tokenizer()
    digest = vocab_fingerprint(first)
    assert digest == full_vocab_fingerprint(first)
    [entry] = list(cache.iterdir())
    assert entry.read_text() == digest
    entry.write_text("f" * 64)  # a planted value proves the next fresh tokenizer reads the file
    assert vocab_fingerprint(load_qwen3_tokenizer()) == "f" * 64


def test_a_damaged_cache_entry_is_recomputed(cache):
    vocab_fingerprint(load_qwen3_tokenizer())
    [entry] = list(cache.iterdir())
    entry.write_text("not a digest")
    fresh = load_qwen3_tokenizer()
    assert vocab_fingerprint(fresh) == full_vocab_fingerprint(fresh)
    assert entry.read_text() == full_vocab_fingerprint(fresh)


def test_added_tokens_change_the_fingerprint_even_on_the_same_object(cache):
    tokenizer = load_qwen3_tokenizer()
    before = vocab_fingerprint(tokenizer)
    tokenizer.add_tokens(["<|rl_data_test_token|>"])
    after = vocab_fingerprint(tokenizer)
    assert after != before and after == full_vocab_fingerprint(tokenizer)
    assert len(list(cache.iterdir())) == 2  # another key: tokenizer.json alone does not decide


def test_a_tokenizer_not_loaded_from_a_folder_is_fingerprinted_in_full(cache):
    tokenizer = load_qwen3_tokenizer()
    tokenizer.name_or_path = "in-memory"
    assert vocab_fingerprint(tokenizer) == full_vocab_fingerprint(tokenizer)
    assert not cache.exists()
