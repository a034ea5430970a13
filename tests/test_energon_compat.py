"""``rl_data.energon.compat``: the explicit install and its version check, the fixes in rl_data's own
subclasses (nothing of Energon is replaced, in this process, in a Ray worker or in Energon's worker
processes), and the only module that reads Energon's private fields.

The restore fix (per-worker counters include the skip offset) is checked end to end in
``test_sft_dataloader_workers.py::test_a_chain_of_restores_with_workers_is_exact``; the worker
additions in ``test_worker_hold.py`` and ``test_worker_checkpoints.py``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from energon_fixtures import batch_source_ids, build_small_train_loader
from megatron.energon.savable_loader import SavableCheckpoint, SavableDatasetCheckpoint
from megatron.energon.savable_loader import SavableDatasetWrapper as EnergonSavableDatasetWrapper
from megatron.energon.watchdog import Watchdog
from packaging.specifiers import SpecifierSet

from rl_data.energon import compat
from rl_data.energon.compat import installation, internals
from rl_data.energon.compat.loader import watchdog_of

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rl_data"
INTERNALS = PACKAGE / "energon" / "compat" / "internals.py"


# -- install ----------------------------------------------------------------------------------


def test_the_supported_range_is_pyprojects_pin():
    [pin] = re.findall(r'^\s*"megatron-energon([^"]*)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert SpecifierSet(pin) == SpecifierSet(compat.SUPPORTED_ENERGON)


def test_install_is_idempotent(monkeypatch):
    compat.install()
    checks = []
    monkeypatch.setattr(installation, "check_version", checks.append)
    compat.install()
    compat.install()
    assert compat.installed() and checks == []  # installed once: nothing is done again


@pytest.mark.parametrize("found", ["7.5.0", "7.3.9", "8.0", "unknown"])
def test_an_unsupported_energon_version_is_refused(found, monkeypatch):
    monkeypatch.setattr(installation, "_energon_version", lambda: found)
    with pytest.raises(RuntimeError) as error:
        compat.install()
    assert str(error.value) == (
        f"rl_data needs megatron-energon>=7.4,<7.5, found {found!r}: rl_data.energon.compat fixes and "
        "reads Energon internals checked against that range only. Install a supported version (pip "
        "install 'megatron-energon>=7.4,<7.5'), or re-check rl_data/energon/compat against the new "
        "version (tests/test_energon_compat.py and the energon tests) and widen SUPPORTED_ENERGON and "
        "pyproject's pin together"
    )


@pytest.mark.parametrize("found", ["7.4.0", "7.4.1", "7.4.9"])
def test_a_supported_version_passes(found):
    compat.check_version(found)


# -- nothing of Energon is replaced -----------------------------------------------------------

#: A fresh interpreter: Energon's functions before rl_data is imported and after it built, used
#: and closed a packed loader with 2 worker processes.
UNTOUCHED = """
import inspect, json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import megatron.energon, megatron.energon.savable_loader, megatron.energon.wrappers.watchdog_dataset

def functions():
    found = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("megatron.energon"):
            continue
        for attr, value in list(vars(module).items()):
            found[f"{name}.{attr}"] = value
            if inspect.isclass(value) and value.__module__ == name:
                for key, member in vars(value).items():
                    found[f"{name}.{attr}.{key}"] = member
    return {key: value for key, value in found.items() if callable(value) or hasattr(value, "__get__")}

before = functions()
from energon_fixtures import ChatDataset, build_small_train_loader
import rl_data.energon.sft_dataloader
from rl_data.energon import compat
from rl_data.tokenization.tokenizer import load_qwen3_tokenizer
installed_by_import = compat.installed()
loader = build_small_train_loader(ChatDataset(Path(sys.argv[1]), {}), load_qwen3_tokenizer(), num_workers=2, packing=True)
batches = iter(loader)
next(batches), next(batches)
loader.state_dict()
loader.close()
after = functions()
print(json.dumps({
    "installed_by_import": installed_by_import,
    "installed_by_build": compat.installed(),
    "changed": sorted(key for key, value in before.items() if after.get(key) is not value),
    "added": sorted(key for key in after.keys() - before.keys() if key.rsplit(".", 1)[0] in before),
}))
"""


@pytest.mark.timeout(180)
def test_importing_changes_nothing_and_building_a_loader_installs_without_replacing_energon(energon_dataset):
    done = subprocess.run(
        [sys.executable, "-c", UNTOUCHED, energon_dataset.path, str(ROOT / "tests")],
        capture_output=True, text=True, timeout=150, check=False, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"installed_by_import": False, "installed_by_build": True, "changed": [], "added": []}


def test_a_loader_is_refused_before_install(monkeypatch):
    monkeypatch.setattr(installation, "_installed", None)
    with pytest.raises(RuntimeError, match=r"install\(\) was not called in this process"):
        compat.SavableLoader(None)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2], ids=["0_workers", "2_workers"])
def test_a_loader_runs_rl_datas_classes_under_energons_names(energon_dataset, tokenizer, workers):
    loader = build_small_train_loader(energon_dataset, tokenizer, num_workers=workers, packing=True)
    energon_loader = loader._loader
    try:
        assert type(energon_loader) is compat.SavableLoader
        watchdog = watchdog_of(energon_loader.dataset)
        assert type(watchdog) is compat.WatchdogDataset
        if workers:
            assert type(energon_loader.dataset) is compat.SavableDatasetWrapper
        # Energon writes type(x).__name__ into restore keys and states: unchanged
        assert (compat.SavableDatasetWrapper.__name__, compat.WatchdogDataset.__name__) == (
            "SavableDatasetWrapper",
            "WatchdogDataset",
        )
        next(iter(loader))
    finally:
        loader.close()


def _build_in_a_ray_worker(path: str) -> dict:
    """In a Ray worker: a loader with 2 Energon workers, its classes and its first batches."""
    from energon_fixtures import ChatDataset, batch_source_ids, build_small_train_loader

    from rl_data.energon import compat
    from rl_data.tokenization.tokenizer import load_qwen3_tokenizer

    loader = build_small_train_loader(ChatDataset(Path(path), {}), load_qwen3_tokenizer(), num_workers=2)
    try:
        batches = iter(loader)
        ids = [batch_source_ids(next(batches))[0] for _ in range(3)]
        return {
            "installed": compat.installed(),
            "wrapper": type(loader._loader.dataset).__module__,
            # only rl_data's wrapper sends checkpoints from the Energon worker processes
            "shipped_checkpoints": len(loader._stream.encoded_worker_states),
            "ids": ids,
        }
    finally:
        loader.close()


@pytest.mark.timeout(180)
def test_a_ray_worker_that_builds_a_loader_has_the_fixes_in_its_energon_workers(ray_session, energon_dataset, tokenizer):
    remote = ray_session.remote(num_cpus=0, max_calls=1)(_build_in_a_ray_worker)
    found = ray_session.get(remote.remote(energon_dataset.path), timeout=150)
    local = build_small_train_loader(energon_dataset, tokenizer, num_workers=2)
    try:
        batches = iter(local)
        expected = [batch_source_ids(next(batches))[0] for _ in range(3)]
    finally:
        local.close()
    assert found["installed"] and found["wrapper"] == "rl_data.energon.compat.loader"
    assert found["shipped_checkpoints"] > 0
    assert found["ids"] == expected


# -- fix 1: a worker that has not started -----------------------------------------------------


def _wrapper(worker_id, checkpoints, restore_from, skip):
    wrapper = object.__new__(compat.SavableDatasetWrapper)
    wrapper._worker_id = worker_id
    wrapper._last_checkpoints = checkpoints
    wrapper._workers_restore_from = restore_from
    wrapper._workers_skip_samples = skip
    return wrapper


def _placeholder():
    return [SavableCheckpoint(state=None, checkpoint_time=time.perf_counter(), sample_index=-1)]


def test_fresh_worker_that_has_not_started_skips_nothing():
    wrapper = _wrapper(1, _placeholder(), [None, None], [0, 0])
    # Energon's own answer is offset 1 here (0 - (-1)): the restored loader loses a sample.
    assert EnergonSavableDatasetWrapper.get_checkpoint(wrapper, [0, -1]).offset == 1
    assert wrapper.get_checkpoint([0, -1]) == SavableDatasetCheckpoint(state=None, offset=0)


def test_restored_worker_that_has_not_started_keeps_its_pending_restore():
    pending = object()
    wrapper = _wrapper(0, _placeholder(), [pending, None], [3, 0])
    checkpoint = wrapper.get_checkpoint([4, -1])
    assert checkpoint.state is pending and checkpoint.offset == 3


def test_started_worker_uses_energons_own_lookup():
    state = object()
    checkpoints = _placeholder() + [
        SavableCheckpoint(state=state, checkpoint_time=time.perf_counter(), sample_index=0)
    ]
    wrapper = _wrapper(0, checkpoints, [None], [0])
    checkpoint = wrapper.get_checkpoint([2])
    assert checkpoint.state is state and checkpoint.offset == 3


# -- fix 3: the watchdog thread ends with its iteration ---------------------------------------


def _watchdog_threads() -> list[threading.Thread]:
    return [
        thread for thread in threading.enumerate()
        if isinstance(getattr(getattr(thread, "_target", None), "__self__", None), Watchdog)
    ]  # fmt: skip


def test_an_ended_or_closed_iteration_leaves_no_watchdog_thread(energon_dataset, tokenizer):
    before = len(_watchdog_threads())
    loader = build_small_train_loader(energon_dataset, tokenizer, num_workers=0, loop_length=3)
    assert len(list(loader)) == 3
    assert len(_watchdog_threads()) == before + 1  # the iteration goes on past the loop
    loader.close()
    assert len(_watchdog_threads()) == before


# -- the only module that reads Energon's private fields --------------------------------------


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _energon_private_names() -> set[str]:
    """Every private attribute ``internals`` reads or writes (all of them Energon's or torch's)."""
    tree = ast.parse(INTERNALS.read_text())
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and _private(node.attr)}


def _energon_names(tree: ast.Module) -> set[str]:
    """Names a module imports from Megatron-Energon."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("megatron"):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("megatron"))
    return names


def _violations(source: str, private: set[str]) -> list[str]:
    """Energon private fields ``source`` touches, and attributes of Energon it replaces. ``self._x``
    is rl_data's own field only in a method of a class that does not derive from Energon."""
    tree = ast.parse(source)
    energon = _energon_names(tree)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def own_field(node: ast.Attribute) -> bool:
        if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            return False
        while node in parents and not isinstance(node, ast.ClassDef):
            node = parents[node]
        return isinstance(node, ast.ClassDef) and not {b.id for b in node.bases if isinstance(b, ast.Name)} & energon

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in private and not own_field(node):
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            arguments = node.args[:2]
            if node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(arguments) == 2:
                target, name = arguments
                if isinstance(name, ast.Constant) and name.value in private:
                    found.append(f"line {node.lineno}: {node.func.id}(..., {name.value!r})")
                if node.func.id in ("setattr", "delattr") and isinstance(target, ast.Name) and target.id in energon:
                    found.append(f"line {node.lineno}: {node.func.id}({target.id}, ...)")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id in energon:
                    found.append(f"line {node.lineno}: {target.value.id}.{target.attr} = ...")
    return found


def test_internals_reads_the_private_fields_the_scan_looks_for():
    assert {"_worker_sample_counters", "_last_checkpoints", "_reading_buffer", "_epoch_iterator"} <= _energon_private_names()


@pytest.mark.parametrize(
    "source",
    [
        "def f(loader):\n    return loader._worker_sample_counters\n",
        "def f(self):\n    return getattr(self._loader, '_epoch_iterator', None)\n",
        "from megatron.energon.savable_loader import SavableDatasetWrapper\nSavableDatasetWrapper.__iter__ = iter\n",
        (
            "from megatron.energon.savable_loader import SavableDataLoader\n"
            "class Mine(SavableDataLoader):\n    def f(self):\n        return self._next_worker_id\n"
        ),
        "def get_checkpoint(self, indexes):\n    return self._last_checkpoints[-1]\n",
    ],
    ids=["private_field", "getattr", "global_replacement", "subclass_reads_self", "patch_function"],
)
def test_the_scan_finds_private_access_and_replacements(source):
    assert _violations(source, _energon_private_names())


def test_no_module_but_compat_internals_reads_energons_private_fields_or_replaces_energon():
    private = _energon_private_names()
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == INTERNALS:
            continue
        violations = _violations(path.read_text(), private)
        if violations:
            found[str(path.relative_to(ROOT))] = violations
    assert found == {}, (
        f"Energon's private fields are read (or Energon replaced) outside {INTERNALS.relative_to(ROOT)}: "
        f"{found}; add an accessor to rl_data.energon.compat.internals and call it instead"
    )


def test_internals_reads_work_on_a_real_loader(energon_dataset, tokenizer):
    loader = build_small_train_loader(energon_dataset, tokenizer, num_workers=2)
    try:
        assert internals.emitted_counters(loader._loader) == [-1, -1]
        assert internals.pending_restores(loader._loader) == [None, None]
        assert internals.micro_batch_size(loader._loader) == 2
        batches = iter(loader)
        next(batches), next(batches)
        worker, sample_index = internals.last_emitted(loader._loader)
        assert (worker, sample_index) == (1, 0)  # the second batch: worker 1's first item
    finally:
        loader.close()


# -- fix 4: open tar files forget their members -----------------------------------------------


def _reading_pipeline(loader: Any) -> Any:
    """The dataset the loader's process reads samples through (no workers): under the watchdog."""
    return watchdog_of(loader._loader.dataset)


def _members_held(readers: list[Any]) -> tuple[int, int]:
    """``(open tar files, TarInfo objects they hold)`` over ``readers``."""
    files = [tar for reader in readers for tar in reader.itar_files_cache.values()]
    return len(files), sum(len(tar.members) for tar in files)


def test_energons_open_shards_keep_a_tarinfo_per_member_read(energon_dataset, tokenizer):
    """Energon's behaviour, which fix 4 bounds (the upstream report's reproduction): every sample
    read through a tar reader leaves its members' ``TarInfo`` in the open shard's ``members``.
    When this fails, Energon stopped keeping them: fix 4 can go."""
    loader = build_small_train_loader(energon_dataset, tokenizer, num_workers=0)
    try:
        (reader,) = internals.tar_readers(_reading_pipeline(loader))
        for index in range(24):  # two shards of 12 samples, read directly
            reader[index]
        files, members = _members_held([reader])
        assert (files, members) == (2, 24)  # each sample here is one tar member (<key>.json)
    finally:
        loader.close()


def test_a_loader_read_for_many_epochs_holds_no_tar_members(energon_dataset, tokenizer):
    loader = build_small_train_loader(energon_dataset, tokenizer, num_workers=0)
    try:
        readers = internals.tar_readers(_reading_pipeline(loader))
        assert len(readers) == 1
        held = []
        for _ in range(3):  # each for loop is one pass of the 192 train samples (96 batches of 2)
            for _batch in loader:
                held.append(_members_held(readers))
        assert len(held) > 3 * 90 and max(files for files, _ in held) >= 2  # shards stayed open ...
        assert {members for _, members in held} == {0}  # ... holding no member of the samples read
    finally:
        loader.close()
