"""Energon's indexing runs in a fresh process: the caller is never forked, failures carry its output."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from energon_fixtures import chat_members, sample_key
from rl_data.energon.dataset_writer import prepare_energon_splits, write_tar_shard
from rl_data.energon.index_process import run_energon_prepare, run_in_own_group

_forks_of_this_process = 0


def _count_fork() -> None:
    global _forks_of_this_process
    _forks_of_this_process += 1


os.register_at_fork(before=_count_fork)


def _shards(root, conversations, keys_per_shard):
    paths = []
    for shard, keys in enumerate(keys_per_shard):
        rel = f"shards/shard-{shard:06d}.tar"
        write_tar_shard(root / rel, [(key, chat_members(conversations[row], row)) for row, key in keys])
        paths.append(rel)
    return paths


def test_indexing_with_workers_never_forks_the_caller(tmp_path, chat_conversations):
    keys = [[(row, sample_key(chat_conversations[row], row)) for row in range(s * 3, s * 3 + 3)] for s in range(4)]
    paths = _shards(tmp_path, chat_conversations, keys)
    forks_before = _forks_of_this_process
    prepare_energon_splits(tmp_path, {"train": paths[:3], "val": paths[3:]}, workers=2, timeout_s=120)
    assert _forks_of_this_process == forks_before
    meta = tmp_path / ".nv-meta"
    assert (meta / "split.yaml").is_file() and (meta / "index.uuid").is_file()
    split_yaml = (meta / "split.yaml").read_text()
    assert "shard-000003.tar" in split_yaml.split("val:")[1]


def test_a_failing_index_raises_with_energons_own_explanation(tmp_path, chat_conversations):
    same_key = sample_key(chat_conversations[0], 0)
    paths = _shards(tmp_path, chat_conversations, [[(0, same_key)], [(1, same_key)]])
    with pytest.raises(RuntimeError, match=r"(?s)failed \(exit code 1\).*duplicate keys"):
        prepare_energon_splits(tmp_path, {"train": paths}, timeout_s=120)


def test_an_index_past_its_timeout_is_stopped_and_named(tmp_path, chat_conversations):
    keys = [[(row, sample_key(chat_conversations[row], row))] for row in range(2)]
    paths = _shards(tmp_path, chat_conversations, keys)
    with pytest.raises(TimeoutError, match=r"did not finish within 0\.01 s and was stopped"):
        run_energon_prepare(tmp_path, paths, [("train", ".*")], workers=1, timeout_s=0.01)


def test_a_timeout_kills_what_the_indexer_forked_too():
    forks_a_sleeper = (
        "import subprocess, sys, time\n"
        "sleeper = subprocess.Popen(['sleep', '300'])\n"
        "print(sleeper.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    with pytest.raises(subprocess.TimeoutExpired) as stopped:
        run_in_own_group([sys.executable, "-c", forks_a_sleeper], "", env=dict(os.environ), timeout_s=5)
    sleeper = int(stopped.value.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _alive(sleeper):
        assert time.monotonic() < deadline, f"the indexer's child {sleeper} outlived the timeout"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().split(") ")[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
