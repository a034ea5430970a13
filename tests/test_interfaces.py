"""rl_data.interfaces: the names and fields of the seed API page, TaskDataSpec prompt files,
and NemoGymSourceIdentity serving as the validity check of an agent-name cache."""

import dataclasses
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rl_data import interfaces
from rl_data.interfaces import (
    DatumSpec,
    NemoGymSourceIdentity,
    PreferenceDatumSpec,
    TaskDataPreProcessFnCallable,
    TaskDataProcessFnCallable,
    TaskDataSpec,
)

TASK_DATA_SPEC_SETTINGS = [
    "task_name",
    "prompt_file",
    "system_prompt_file",
    "num_frames",
    "video_sampling_style",
    "video_target_num_patches",
    "video_temporal_patch_size",
    "video_maintain_aspect_ratio",
    "pad_audio_to_hop_length",
    "min_generation_tokens",
    "image_max_num_tiles",
]


# --- names and fields of the seed page ----------------------------------------------------


def test_module_exposes_every_name_of_the_seed_page():
    for name in [
        "NemoGymSourceIdentity",
        "DatumSpec",
        "PreferenceDatumSpec",
        "TaskDataSpec",
        "TaskDataProcessFnCallable",
        "TaskDataPreProcessFnCallable",
        "LLMMessageLogType",
        "VLMMessageLogType",
        "FlatMessagesType",
        "PathLike",
        "TokenizerType",
    ]:
        assert hasattr(interfaces, name), name


def test_tokenizer_type_is_transformers_base_and_loaded_lazily():
    from transformers import PreTrainedTokenizerBase

    assert interfaces.TokenizerType is PreTrainedTokenizerBase
    probe = "import sys, rl_data.interfaces; print('transformers' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert result.stdout.strip() == "False"


def test_datum_specs_have_the_listed_required_and_optional_keys():
    assert DatumSpec.__required_keys__ == {
        "message_log",
        "length",
        "extra_env_info",
        "loss_multiplier",
        "idx",
    }
    assert DatumSpec.__optional_keys__ == {
        "task_name",
        "message_loss_mask",
        "tools",
        "stop_strings",
        "__extra__",
    }
    assert PreferenceDatumSpec.__required_keys__ == {
        "message_log_chosen",
        "message_log_rejected",
        "length_chosen",
        "length_rejected",
        "loss_multiplier",
        "idx",
    }
    assert PreferenceDatumSpec.__optional_keys__ == {"task_name"}


def test_task_data_spec_fields_all_default_to_none():
    fields = dataclasses.fields(TaskDataSpec)
    assert [f.name for f in fields if f.init] == TASK_DATA_SPEC_SETTINGS
    assert [f.name for f in fields if not f.init] == ["prompt", "system_prompt"]
    spec = TaskDataSpec()
    assert all(getattr(spec, f.name) is None for f in fields)
    with pytest.raises(TypeError):
        TaskDataSpec(prompt="set through prompt_file only")


def test_processing_callables_have_the_documented_signatures():
    process = inspect.signature(TaskDataProcessFnCallable.__call__)
    assert list(process.parameters) == [
        "self",
        "datum_dict",
        "task_data_spec",
        "tokenizer",
        "max_seq_length",
        "idx",
    ]
    preprocess = inspect.signature(TaskDataPreProcessFnCallable.__call__)
    assert list(preprocess.parameters) == ["self", "datum_dict"]
    with pytest.raises(TypeError):
        TaskDataProcessFnCallable()


# --- TaskDataSpec prompt files ------------------------------------------------------------


def test_prompt_files_are_read_as_utf8(tmp_path):
    prompt = "Réponds en français : {} 🚀\nПример — 例\n"
    system = "Du bist ein hilfreicher Assistent. ✓"
    (tmp_path / "prompt.txt").write_bytes(prompt.encode("utf-8"))
    (tmp_path / "system.txt").write_bytes(system.encode("utf-8"))
    spec = TaskDataSpec(
        task_name="chat",
        prompt_file=tmp_path / "prompt.txt",
        system_prompt_file=str(tmp_path / "system.txt"),
    )
    assert spec.prompt == prompt
    assert spec.system_prompt == system
    assert spec.prompt.format("Bonjour") == "Réponds en français : Bonjour 🚀\nПример — 例\n"


@pytest.mark.parametrize("field_name", ["prompt_file", "system_prompt_file"])
def test_missing_prompt_file_names_the_field_and_path(tmp_path, field_name):
    missing = tmp_path / "nope" / "prompt.txt"
    with pytest.raises(FileNotFoundError) as info:
        TaskDataSpec(**{field_name: missing})
    assert str(info.value) == (
        f"TaskDataSpec.{field_name}: no file at {str(missing)!r} (absolute: {str(missing)!r}); "
        f"point {field_name} at an existing UTF-8 text file or leave it None"
    )


def test_prompt_file_that_is_not_utf8_is_a_clear_error(tmp_path):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Réponds".encode("latin-1"))
    with pytest.raises(
        ValueError, match=r"^TaskDataSpec.prompt_file: '.*latin1.txt' is not valid UTF-8"
    ):
        TaskDataSpec(prompt_file=latin1)


def test_copy_defaults_fills_only_fields_that_are_none(tmp_path):
    (tmp_path / "default_prompt.txt").write_text("Default: {}", encoding="utf-8")
    (tmp_path / "own_system.txt").write_text("Own system", encoding="utf-8")
    defaults = TaskDataSpec(
        task_name="default",
        prompt_file=tmp_path / "default_prompt.txt",
        num_frames=8,
        video_maintain_aspect_ratio=True,
        min_generation_tokens=2000,
    )
    spec = TaskDataSpec(
        task_name="math",
        system_prompt_file=tmp_path / "own_system.txt",
        num_frames=4,
        video_maintain_aspect_ratio=False,
    )
    spec.copy_defaults(defaults)
    assert (spec.task_name, spec.num_frames, spec.video_maintain_aspect_ratio) == ("math", 4, False)
    assert spec.system_prompt == "Own system"
    assert spec.prompt == "Default: {}" and spec.prompt_file == tmp_path / "default_prompt.txt"
    assert spec.min_generation_tokens == 2000
    assert spec.image_max_num_tiles is None
    assert defaults.system_prompt is None and defaults.num_frames == 8  # source untouched


# --- NemoGymSourceIdentity ----------------------------------------------------------------


def test_identity_is_a_frozen_hashable_snapshot_of_stat(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("{}\n", encoding="utf-8")
    stat = os.stat(path)
    identity = NemoGymSourceIdentity.from_stat(str(path), stat)
    assert dataclasses.astuple(identity) == (
        str(path),
        stat.st_dev,
        stat.st_ino,
        stat.st_ctime_ns,
        stat.st_mtime_ns,
        stat.st_size,
    )
    assert identity.matches(stat)
    assert {identity, NemoGymSourceIdentity.from_stat(str(path), os.stat(path))} == {identity}
    with pytest.raises(dataclasses.FrozenInstanceError):
        identity.size = 0


STAT_FIELDS = {
    "device": "st_dev",
    "inode": "st_ino",
    "ctime_ns": "st_ctime_ns",
    "mtime_ns": "st_mtime_ns",
    "size": "st_size",
}


@pytest.mark.parametrize("changed", sorted(STAT_FIELDS))
def test_identity_stops_matching_when_any_one_field_changes(tmp_path, changed):
    path = tmp_path / "data.jsonl"
    path.write_text("{}\n", encoding="utf-8")
    stat = os.stat(path)
    identity = NemoGymSourceIdentity.from_stat(str(path), stat)
    fields = {attr: getattr(stat, attr) for attr in [*STAT_FIELDS.values(), "st_atime_ns"]}
    assert identity.matches(SimpleNamespace(**{**fields, "st_atime_ns": 1}))  # atime is ignored
    attr = STAT_FIELDS[changed]
    assert not identity.matches(SimpleNamespace(**{**fields, attr: fields[attr] + 1}))


class AgentNameCache:
    """Agent names per Gym JSONL file, re-read only when the file's identity changes."""

    def __init__(self):
        self._entries: dict[str, tuple[NemoGymSourceIdentity, tuple[str, ...]]] = {}
        self.reads = 0

    def agent_names(self, path) -> tuple[str, ...]:
        resolved = os.path.realpath(path)
        cached = self._entries.get(resolved)
        if cached is not None and cached[0].matches(os.stat(resolved)):
            return cached[1]
        with open(resolved, encoding="utf-8") as f:
            # Identity of the file actually opened, taken before reading it.
            identity = NemoGymSourceIdentity.from_stat(resolved, os.fstat(f.fileno()))
            rows = [json.loads(line) for line in f if line.strip()]
        self.reads += 1
        names = tuple(dict.fromkeys(row["agent_ref"]["name"] for row in rows))
        self._entries[resolved] = (identity, names)
        return names


def gym_rows(*agents: str) -> str:
    return "".join(
        json.dumps(
            {
                "responses_create_params": {"input": [{"role": "user", "content": f"q{i}"}]},
                "agent_ref": {"type": "responses_api_agents", "name": name},
            }
        )
        + "\n"
        for i, name in enumerate(agents)
    )


def set_mtime(path: Path, mtime_ns: int) -> None:
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_agent_name_cache_reuses_until_the_file_changes(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(gym_rows("math_agent", "code_agent", "math_agent"), encoding="utf-8")
    base_ns = 1_700_000_000 * 10**9
    set_mtime(path, base_ns)
    cache = AgentNameCache()

    assert cache.agent_names(path) == ("math_agent", "code_agent")
    assert cache.agent_names(path) == ("math_agent", "code_agent")
    assert cache.agent_names(str(path)) == ("math_agent", "code_agent")
    assert cache.reads == 1  # unchanged file: served from the cache

    # Rewritten in place with different length.
    path.write_text(gym_rows("search_agent"), encoding="utf-8")
    set_mtime(path, base_ns + 1 * 10**9)
    assert cache.agent_names(path) == ("search_agent",)
    assert cache.reads == 2
    assert cache.agent_names(path) == ("search_agent",) and cache.reads == 2

    # Rewritten in place to exactly the same size ("search" -> "wordle").
    size_before = path.stat().st_size
    path.write_text(gym_rows("wordle_agent"), encoding="utf-8")
    set_mtime(path, base_ns + 2 * 10**9)
    assert path.stat().st_size == size_before
    assert cache.agent_names(path) == ("wordle_agent",)
    assert cache.reads == 3

    # Replaced atomically by a new file (new inode), same size and even the same mtime.
    replacement = tmp_path / "train.jsonl.tmp"
    replacement.write_text(gym_rows("sudoku_agent"), encoding="utf-8")
    set_mtime(replacement, base_ns + 2 * 10**9)
    inode_before = path.stat().st_ino
    os.replace(replacement, path)
    assert path.stat().st_ino != inode_before and path.stat().st_size == size_before
    assert cache.agent_names(path) == ("sudoku_agent",)
    assert cache.reads == 4

    # Touched: same contents, new mtime -> re-read (the cache cannot know nothing changed).
    set_mtime(path, base_ns + 3 * 10**9)
    assert cache.agent_names(path) == ("sudoku_agent",)
    assert cache.reads == 5
    assert cache.agent_names(path) == ("sudoku_agent",) and cache.reads == 5


def test_agent_name_cache_sees_a_same_size_rewrite_that_restores_mtime(tmp_path):
    """Tools that preserve mtime (rsync -t, tar) leave only ctime changed: still detected."""
    path = tmp_path / "train.jsonl"
    path.write_text(gym_rows("alpha_agent"), encoding="utf-8")
    set_mtime(path, 1_700_000_000 * 10**9)
    cache = AgentNameCache()
    assert cache.agent_names(path) == ("alpha_agent",)
    before = path.stat()

    time.sleep(0.05)  # let the filesystem's coarse ctime clock advance
    path.write_text(gym_rows("bravo_agent"), encoding="utf-8")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )
    assert after.st_ctime_ns != before.st_ctime_ns

    assert cache.agent_names(path) == ("bravo_agent",)
    assert cache.reads == 2
