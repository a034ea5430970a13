"""``rl_data.distributed.preload``: Ray's idle workers import the loader stack before they accept work.

A driver of its own (a subprocess: the test session's Ray was started without the setting) runs a
private local Ray with ``preload.SYSTEM_CONFIG``: a rank actor lands in a prestarted worker that
had the stack imported before its constructor ran, and its coordinator hands out the batches the
loaders give when read directly in the test process (no Ray), as every coordinator does. A worker
of the test session's Ray (no preload) holds none of the stack before its constructor runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid

import pytest

from distributed_fixtures import TIMEOUT_S, reference_stream, train_spec
from ray_head import private_ray_dir
from rl_data.distributed.config import LoaderSpec, ParallelLayout, RuntimeConfig

STACK = ["torch", "megatron.energon", "transformers", "rl_data.energon.sft_dataloader", "rl_data.tasks.chat_sft"]

DRIVER = textwrap.dedent(
    """
    import json, sys, time
    import psutil, ray
    from rl_data import LoaderSpec, RuntimeConfig, start_data_coordinator
    from rl_data.distributed.preload import SYSTEM_CONFIG

    temp_dir, runs, stack = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=temp_dir, _system_config=SYSTEM_CONFIG)

    def pool_is_quiet():  # this driver's raylet prestarted its 2 workers and they finished importing
        try:
            idle = [p for p in psutil.Process().children(recursive=True) if "ray::IDLE" in " ".join(p.cmdline())]
            return len(idle) >= 2 and all(p.cpu_percent(interval=0.3) < 5 for p in idle)
        except psutil.Error:
            return False

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not pool_is_quiet():
        time.sleep(0.2)
    before = time.time()
    ids, rank_prestarted = [], []
    for config_json, spec_json in runs:  # the first gets the prestarted workers
        config, spec = RuntimeConfig.model_validate_json(config_json), LoaderSpec.model_validate_json(spec_json)
        coordinator = start_data_coordinator(config, spec)
        for _ in range(6):  # past the 5-batch virtual epoch
            _, refs = ray.get(coordinator.next_step.remote(), timeout=60)
            ids.append(list(ray.get(refs[0], timeout=60)["source_ids"]))
        rank_pid = ray.get(coordinator.status.remote(), timeout=60)["ranks"][0]["pid"]
        rank_prestarted.append(psutil.Process(rank_pid).create_time() < before)
        ray.get(coordinator.shutdown.remote(), timeout=60)

    @ray.remote(num_cpus=0)
    class Probe:
        def __init__(self):
            self.loaded = [name for name in stack if name in sys.modules]  # before anything ran here

        def report(self):
            return self.loaded

    print(json.dumps({
        "ids": ids,
        "rank_prestarted": rank_prestarted[0],
        "loaded_before_constructor": ray.get(Probe.remote().report.remote(), timeout=60),
    }))
    """
)


def run_driver(runs: list[tuple[RuntimeConfig, LoaderSpec]]) -> dict:
    """The driver's result for coordinators of ``(config, spec)`` run one after another."""
    runs_json = json.dumps([(config.model_dump_json(), spec.model_dump_json()) for config, spec in runs])
    temp_dir = private_ray_dir("preload-")
    try:
        done = subprocess.run(
            [sys.executable, "-c", DRIVER, temp_dir, runs_json, json.dumps(STACK)],
            capture_output=True, text=True, timeout=180, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
        )
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def packed_spec(dataset, energon: dict):
    return train_spec(dataset, data_config={"energon": energon, "shuffle": True}, packing_algorithm="first_fit_decreasing")


def coordinator_config(index: int, prefetch_depth: int) -> RuntimeConfig:
    return RuntimeConfig(parallel_layout=ParallelLayout(dp=1), prefetch_depth=prefetch_depth,
                         bundle_resources={"CPU": 0.5}, rank_actor_num_cpus=0.5, namespace="rl_data_tests",
                         name=f"preload_test_{index}", step_timeout_s=TIMEOUT_S,
                         control_timeout_s=TIMEOUT_S)  # fmt: skip


@pytest.fixture(scope="module")
def runs(energon_dataset) -> list[tuple[RuntimeConfig, LoaderSpec]]:
    """0 Energon workers unpacked without prefetch, then 2 workers packed with prefetch 2."""
    packed = {"shuffle_buffer_size": 20, "max_samples_per_sequence": 10, "packing_buffer_size": 8, "num_workers": 2}
    return [(coordinator_config(0, 0), train_spec(energon_dataset)),
            (coordinator_config(1, 2), packed_spec(energon_dataset, packed))]  # fmt: skip


@pytest.fixture(scope="module")
def preloaded(runs) -> dict:
    return run_driver(runs)


@pytest.mark.slow  # a private Ray session (~20 s); CI runs it
def test_preloaded_workers_hold_the_loader_stack_before_any_actor_code_runs(preloaded):
    assert preloaded["loaded_before_constructor"] == STACK


def test_a_worker_without_the_setting_imports_none_of_the_stack_itself(ray_session):
    class Probe:  # defined here: pickled by value, so the worker imports no test module for it
        def __init__(self, stack):
            self.loaded = [name for name in stack if name in sys.modules]  # before anything ran here

        def report(self):
            return self.loaded

    # an environment of its own: a new worker process, never one an earlier test's task ran in
    fresh_worker = {"runtime_env": {"env_vars": {"RL_DATA_PROBE": uuid.uuid4().hex}}}
    probe = ray_session.remote(num_cpus=0)(Probe).options(**fresh_worker).remote(STACK)
    try:
        assert ray_session.get(probe.report.remote(), timeout=TIMEOUT_S) == []
    finally:
        ray_session.kill(probe)


@pytest.mark.slow
def test_a_rank_actor_lands_in_a_prestarted_worker_and_its_batches_do_not_change(runs, preloaded, tokenizer):
    assert preloaded["rank_prestarted"]
    # the loaders read directly here (no Ray): per run, per step the ids of the one rank
    direct = [[ids for [ids] in reference_stream(spec, config, tokenizer, 6)] for config, spec in runs]
    assert preloaded["ids"] == json.loads(json.dumps(direct[0] + direct[1]))  # same sample ids, same order
    unpacked, packed = preloaded["ids"][:6], preloaded["ids"][6:]
    assert all(len(step) == 2 for step in unpacked) and len(packed) == 6 and all(packed)


def test_the_system_config_names_this_module():
    from rl_data.distributed import preload

    assert preload.SYSTEM_CONFIG == {"preload_python_modules": ["rl_data.distributed.preload"]}


def test_a_module_that_fails_to_import_is_logged_and_the_worker_still_starts(caplog):
    from rl_data.distributed.preload import preload

    with caplog.at_level("WARNING", logger="rl_data.distributed.preload"):
        failed = preload(("json", "rl_data_no_such_module", "rl_data.tasks.chat_sft"))
    assert list(failed) == ["rl_data_no_such_module"]
    assert "ModuleNotFoundError" in failed["rl_data_no_such_module"]
    assert "could not import rl_data_no_such_module" in caplog.text


def test_preload_imports_what_a_rank_actor_needs_before_its_first_batch(energon_dataset):
    # a fresh interpreter: after preload, loading the tokenizer and building and iterating a loader
    # (the rank actor's work) imports no library module (only multiprocessing/profiler helpers)
    spec = packed_spec(energon_dataset, {"shuffle_buffer_size": 20, "max_samples_per_sequence": 10, "packing_buffer_size": 8})
    code = (
        "import json, sys, rl_data.distributed.preload; before = set(sys.modules)\n"
        "from rl_data import LoaderSpec\n"
        "from rl_data.energon.sft_dataloader import build_energon_sft_loader\n"
        "from rl_data import load_qwen3_tokenizer\n"
        "spec = LoaderSpec.model_validate_json(sys.argv[1])\n"
        "loader = build_energon_sft_loader(**spec.builder_kwargs(), processor=load_qwen3_tokenizer(),\n"
        "    logical_rank=0, logical_world_size=1, placement_fingerprint='preload-test')\n"
        "next(iter(loader)); loader.state_dict()\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, spec.model_dump_json()], capture_output=True, text=True, timeout=120,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    new = json.loads(done.stdout.strip().splitlines()[-1])
    assert [m for m in new if not m.startswith(("multiprocessing.", "torch.profiler."))] == []
