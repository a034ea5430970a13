"""tiktoken encodes exactly like the tokenizer where :mod:`rl_data.tokenization.fast_encode` uses it,
and only there."""

from __future__ import annotations

import copy
import json
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from rl_data.tokenization import chat
from rl_data.tokenization.chat import get_formatted_message_log
from rl_data.tokenization import fast_encode as fe
from rl_data.tokenization.tokenizer_cache import read_entry

# Pieces for every clause of the equality argument: contractions, letter runs next to digits
# and punctuation, whitespace runs of every kind (the split regex's lookahead), repeated
# pieces (merge order), combining marks (NFC), non-ASCII letters and digits, emoji, added
# tokens whole and in fragments.
PIECES = [
    "a", "Z", "word", "'s", "'re", "'LL", "1", "42", "٣", "3.14", ".", ",", "!?", "...", "-", "=", "==",
    " ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\r\n", "\r", "\u00a0", "\u3000", "e\u0301", "\u0301",
    "\u0338", "é", "ß", "İ", "ǅ", "東京", "日本語", "ﬁ", "🙂", "👩‍👩‍👧", "ab", "aba", "ha", "lol", "zz",
    "<think>", "</think>", "<thin", "<|im_start|>", "<|im_end|>", "<|im_", "_end|>", "<|endoftext|>",
]  # fmt: skip
TEXTS = st.lists(st.sampled_from(PIECES), min_size=1, max_size=60).map("".join)


def _reference(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_project_tokenizer_is_encoded_by_tiktoken(tokenizer):
    assert fe.text_encoder(tokenizer).kind == "tiktoken"


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXTS)
def test_tiktoken_gives_the_tokenizers_ids_on_adversarial_text(tokenizer, text):
    assert fe.text_encoder(tokenizer).encode(text) == _reference(tokenizer, text)


@pytest.mark.slow  # 4,017 conversations; the default run has the adversarial-text property test
def test_tiktoken_gives_the_tokenizers_ids_on_every_real_conversation(tokenizer, chat_conversations):
    encode = fe.text_encoder(tokenizer).encode
    tokens = 0
    for conversation in chat_conversations:
        text = "".join(m["content"] for m in get_formatted_message_log(conversation["messages"], tokenizer))
        ids = encode(text)
        assert ids == tokenizer.backend_tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids
        tokens += len(ids)
    assert tokens > 1_000_000


def test_runs_of_every_vocabulary_piece_merge_alike(tokenizer):
    """Repeating a token's text 2-7 times is where two merge orders could part ways."""
    encode = fe.text_encoder(tokenizer).encode
    pieces = [tokenizer.convert_tokens_to_string([token]) for token in list(tokenizer.get_vocab())[:: 15]]
    texts = [piece * repeat for piece in pieces if piece for repeat in (2, 3, 7)]
    texts = [text for text in texts if unicodedata.is_normalized("NFC", text)]
    expected = [e.ids for e in tokenizer.backend_tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    assert [encode(text) for text in texts] == expected
    assert len(texts) > 20_000


def test_text_that_is_not_nfc_goes_to_the_backend(tokenizer):
    # composed by NFC across the end of an added token, which the backend never does
    for text in ("<|im_end|>\u0338 x", "e\u0301 accent", "A\u030a"):
        assert not unicodedata.is_normalized("NFC", text)
        assert fe.text_encoder(tokenizer).encode(text) == _reference(tokenizer, text)


def test_a_lone_surrogate_fails_as_in_the_tokenizer(tokenizer):
    with pytest.raises(TypeError) as expected:
        _reference(tokenizer, "a\ud800b")
    with pytest.raises(type(expected.value)):
        fe.text_encoder(tokenizer).encode("a\ud800b")


def test_tokens_added_after_loading_are_encoded_as_the_tokenizer_does(tokenizer):
    grown = copy.deepcopy(tokenizer)
    grown.add_tokens(["<extra_marker>"], special_tokens=True)
    text = "before<extra_marker>after <|im_end|>"
    assert fe.text_encoder(grown).kind == "tiktoken"
    assert fe.text_encoder(grown).encode(text) == _reference(grown, text)
    assert len(fe.text_encoder(grown).encode(text)) < len(fe.text_encoder(tokenizer).encode(text))


def test_configurations_tiktoken_cannot_match_use_the_backend_or_the_tokenizer(tokenizer, monkeypatch):
    text = "<|im_start|>user\nHello there, it's 42 degrees<|im_end|>\n"
    truncating = copy.deepcopy(tokenizer)
    truncating.backend_tokenizer.enable_truncation(max_length=4)
    splitting = copy.deepcopy(tokenizer)
    splitting.split_special_tokens = True
    # an added token that is a prefix of another: tiktoken would match them in another order
    prefixed = copy.deepcopy(tokenizer)
    prefixed.add_tokens(["<|im_start|>x"], special_tokens=True)
    for other, kind in ((truncating, "tokenizer"), (splitting, "tokenizer"), (prefixed, "backend")):
        assert fe.text_encoder(other).kind == kind
        assert fe.text_encoder(other).encode(text) == _reference(other, text)
    monkeypatch.setenv("RL_DATA_TIKTOKEN", "0")
    assert fe.text_encoder(tokenizer).kind == "backend"


def test_a_difference_found_by_the_guard_hands_the_tokenizer_to_its_backend(tokenizer, monkeypatch, caplog):
    import tiktoken

    class Differing(tiktoken.Encoding):  # a tiktoken that gets texts holding "MARK" wrong
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            real = self._core_bpe

            class Core:
                @staticmethod
                def encode(text, allowed):
                    return real.encode(text, allowed) + ([0] if "MARK" in text else [])

            self._core_bpe = Core()

    monkeypatch.setattr(tiktoken, "Encoding", Differing)
    fresh = copy.deepcopy(tokenizer)  # not in the per-tokenizer cache yet
    encoder = fe.text_encoder(fresh)
    assert encoder.kind == "tiktoken"
    assert encoder.encode("no mark here") == _reference(fresh, "no mark here")
    with caplog.at_level("ERROR", logger=fe.__name__):
        assert encoder.encode("a MARK") == _reference(fresh, "a MARK")
    assert "tiktoken encoded a text unlike the tokenizer" in caplog.text
    for _ in range(2 * fe._CHECK_EVERY):  # unchecked texts too: the backend from now on
        assert encoder.encode("MARK again") == _reference(fresh, "MARK again")


def test_a_tokenizer_with_merges_missing_uses_the_backend(tokenizer):
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    merges = state["model"]["merges"]
    del merges[len(merges) // 2]  # one split of one token is no longer a merge
    incomplete = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(state)))
    assert not fe.merges_match_ranks(incomplete)
    assert fe.text_encoder(incomplete).kind == "backend"


def test_the_verdict_is_kept_per_tokenizer_file(fresh_cache, monkeypatch):
    from rl_data.tokenization.tokenizer import load_qwen3_tokenizer

    loaded = load_qwen3_tokenizer()  # from a cache of its own
    assert fe.merges_match_ranks(loaded)
    (entry,) = (fresh_cache / fe._CACHE_FOLDER).iterdir()
    assert read_entry(entry) == "1"
    entry.write_text("0", encoding="ascii")  # the cache decides from now on ...
    assert not fe.merges_match_ranks(loaded)
    entry.write_text("garbage", encoding="ascii")  # ... unless it cannot be read
    assert fe.merges_match_ranks(loaded) and read_entry(entry) == "1"


def test_the_ranks_are_kept_per_tokenizer_file(fresh_cache, monkeypatch):
    from rl_data.tokenization.tokenizer import load_qwen3_tokenizer

    loaded = load_qwen3_tokenizer()  # from a cache of its own
    text = "Ranks kept on disk: ßé 東京 🙂 <think>x</think>\n\n  42"
    expected = _reference(loaded, text)
    assert fe._build(loaded).encode(text) == expected
    (entry,) = (fresh_cache / fe._RANKS_FOLDER).iterdir()
    ranks = fe.byte_level_ranks(loaded.backend_tokenizer.get_vocab(with_added_tokens=False))
    assert fe.ranks_from_entry(read_entry(entry)) == ranks

    def not_again(vocab):
        raise AssertionError("the ranks were computed again")

    monkeypatch.setattr(fe, "byte_level_ranks", not_again)
    assert fe._build(loaded).encode(text) == expected  # read from the entry
    monkeypatch.undo()
    monkeypatch.setenv("RL_DATA_CACHE", str(fresh_cache))
    entry.write_text(read_entry(entry)[:-8], encoding="ascii")  # damaged: computed again, rewritten
    assert fe._build(loaded).encode(text) == expected
    assert fe.ranks_from_entry(read_entry(entry)) == ranks


def test_a_ranks_entry_round_trips_and_a_damaged_one_reads_as_missing():
    ranks = {bytes([byte]): byte for byte in range(256)} | {b"  ": 256, "hé".encode(): 300, b"": 7}
    text = fe.ranks_entry(ranks)
    assert fe.ranks_from_entry(text) == ranks
    digest, ids, lengths, joined = text.split(" ")
    other = fe.ranks_entry({**ranks, b"  ": 257})
    for damaged in (
        None, "", "garbage", text[:-4], text.replace(digest, digest[::-1]), f"{digest} {ids} {lengths}",
        f"{digest} {ids} {lengths} {joined} {joined}", f"{digest} {ids}! {lengths} {joined}",
        f"{other.split(' ')[0]} {ids} {lengths} {joined}",
    ):
        assert fe.ranks_from_entry(damaged) is None, damaged


def test_formatting_encodes_each_conversation_once_through_tiktoken(tokenizer, chat_conversations, monkeypatch):
    calls = []
    real = fe.text_encoder

    def counting(tok):
        encoder = real(tok)
        return fe.TextEncoder(encoder.kind, lambda text: calls.append(encoder.kind) or encoder.encode(text))

    monkeypatch.setattr(chat, "text_encoder", counting)
    for conversation in chat_conversations[:100]:
        calls.clear()
        get_formatted_message_log(conversation["messages"], tokenizer)
        assert calls == ["tiktoken"]


@pytest.mark.parametrize(
    ("vocab", "merges", "expected"),
    [
        ({"a": 0, "b": 1, "ab": 2, "abb": 3}, [("a", "b"), ("ab", "b")], True),
        ({"a": 0, "b": 1, "ab": 2, "abb": 3}, ["a b", "ab b"], True),  # the string form
        ({"a": 0, "b": 1, "ab": 2, "abb": 3}, [("ab", "b"), ("a", "b")], False),  # listed against id order
        ({"a": 0, "b": 1, "ab": 2, "bb": 3, "abb": 4}, [("a", "b"), ("b", "b"), ("ab", "b")], False),  # a + bb missing
        ({"a": 0, "b": 1, "ab": 2}, [("a", "b"), ("b", "b")], False),  # a merge into no token
    ],
)
def test_merges_are_complete_and_ordered(vocab, merges, expected):
    assert fe.merges_are_complete_and_ordered(vocab, merges) is expected


def test_byte_level_ranks():
    alphabet = {character: byte for character, byte in fe._byte_level_alphabet().items()}
    assert len(alphabet) == 256 and sorted(alphabet.values()) == list(range(256))
    vocab = {character: byte for character, byte in alphabet.items()} | {"ĠĠ": 256, "hé": 257}
    ranks = fe.byte_level_ranks(vocab)
    assert ranks[b"  "] == 256 and ranks["hé".encode("latin-1")] == 257 and ranks[b"\n"] == alphabet["Ċ"]
    assert fe.byte_level_ranks({**vocab, "東": 300}) is None  # not byte-level text
    assert fe.byte_level_ranks({"a": 0}) is None  # bytes without a token
