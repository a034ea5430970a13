"""rl_data under Ray Train's own failures and resumes: a real ``TorchTrainer`` (Train V2, DDP on
gloo) takes every step's batches from the coordinator through ``TrainData``.

Every worker logs the sample ids it trained per step, with the step its attempt resumed from.
The lineage (each attempt's steps, after rolling back to the checkpoint it resumed from) must
equal the uninterrupted stream: nothing lost, nothing trained twice; and the final model must
equal a replay of that stream in this process.

CPU: a ``fit()`` costs ~7 CPU-s (the Train controller and its actors), each worker group start ~4
(its actors) plus ~5 per worker (torch), a coordinator ~2 plus ~4 per rank actor. The worker
failure tests run 2 workers (rank 0 restores, rank 1 waits for it); the tests whose subject is a
rerun driver or a coordinator timeout run 1.
"""

from __future__ import annotations

import json
import os
import re
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from distributed_fixtures import TIMEOUT_S, reference_batches, running_coordinator, runtime_config, train_spec
from energon_fixtures import write_chat_dataset
from rl_data.distributed.client import CoordinatorClient
from rl_data.integrations.ray_train import TrainData, data_state, loop_config

pytestmark = pytest.mark.timeout(600)

DP = 2
EMBED = 4
LEARNING_RATE = 0.1


@pytest.fixture(scope="module", autouse=True)
def train_settings():
    """Ray Train settings of this module's runs (fit() passes them on to the controller and workers)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "300")  # 60 s is tight on a loaded 2-core VM
        # the preemption watcher (an actor per worker group, ~1.6 CPU-s) reacts to node drains: none here
        patch.setenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
        yield


def _model(vocab_size: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.EmbeddingBag(vocab_size, EMBED, mode="mean")


def _loss(model: torch.nn.Module, batch) -> torch.Tensor:
    """A loss over every trained token of the batch (its value depends on which samples it holds)."""
    tokens = batch["input_ids"] * batch["token_mask"].long()
    per_sample = model(tokens).pow(2).sum(dim=1)
    return per_sample.mean()


def _fire_once(config: dict, kind: str, step: int) -> bool:
    """Whether the injected failure ``kind`` is due at ``step`` on this worker (each fires once)."""
    import ray.train

    planned = config.get(kind)
    if planned is None or tuple(planned) != (step, ray.train.get_context().get_world_rank()):
        return False
    marker = Path(config["log_dir"]) / f"fired-{kind}"
    if marker.exists():
        return False
    marker.write_text(str(step))
    return True


def train_loop(config: dict) -> None:
    """What a user writes (about ten lines), plus the test's log and injected failures."""
    import ray.train
    import ray.train.torch

    _append(Path(config["log_dir"]) / "attempts.jsonl", {"rank": ray.train.get_context().get_world_rank()})
    data = TrainData(config["data"])
    net = _model(config["vocab_size"])
    model = ray.train.torch.prepare_model(net)  # DDP over 2 workers, the model itself on 1
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            saved = torch.load(Path(directory) / "model.pt", weights_only=True)
        net.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
    attempt = uuid.uuid4().hex[:8]
    log = Path(config["log_dir"]) / f"rank{data.dp_rank}.jsonl"
    for step, batch in data.steps(config["steps"], resume_from=checkpoint):
        if step == data.resumed_step + 1:
            _append(log, {"attempt": attempt, "resumed_from": data.resumed_step})
        if _fire_once(config, "raise_at", step):
            raise RuntimeError(f"injected failure at step {step}")
        if _fire_once(config, "kill_at", step):
            os.kill(os.getpid(), signal.SIGKILL)
        optimizer.zero_grad()
        loss = _loss(model, batch)
        loss.backward()
        optimizer.step()
        _append(log, {"attempt": attempt, "step": step, "ids": list(batch["source_ids"])})

        def save(directory: str) -> None:
            torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict()}, Path(directory) / "model.pt")

        data.report({"loss": loss.item(), "step": step}, save=save if step % config["every"] == 0 else None)


def _append(path: Path, record: dict) -> None:
    with open(path, "a") as out:
        out.write(json.dumps(record) + "\n")


def lineage(log_dir: Path, rank: int) -> tuple[dict[int, list[str]], int]:
    """``{step: ids}`` that survived every roll-back on ``rank``, and how many attempts there were."""
    trained: dict[int, list[str]] = {}
    attempts = 0
    for line in (log_dir / f"rank{rank}.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "resumed_from" in record:
            attempts += 1
            trained = {step: ids for step, ids in trained.items() if step <= record["resumed_from"]}
        else:
            assert record["step"] not in trained, f"rank {rank} trained step {record['step']} twice in one lineage"
            trained[record["step"]] = record["ids"]
    return trained, attempts


def uninterrupted(spec, config, tokenizer, steps: int) -> tuple[list[list[list[str]]], list[list[Any]]]:
    """The uninterrupted stream, read once: ``[step][rank] -> source ids`` and ``[step][rank] -> batch``."""
    batches = reference_batches(spec, config, tokenizer, steps)
    return [[list(batch["source_ids"]) for batch in step] for step in batches], batches


def replay_model(batches: list[list[Any]], vocab_size: int) -> dict[str, torch.Tensor]:
    """The model trained on the uninterrupted stream in this process (DDP's mean of the ranks' gradients)."""
    model = _model(vocab_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    for step_batches in batches:
        grads = []
        for batch in step_batches:
            model.zero_grad()
            _loss(model, batch).backward()
            grads.append(model.weight.grad.clone())
        model.weight.grad = sum(g / len(grads) for g in grads)
        optimizer.step()
    return model.state_dict()


def _fit(ray, *, tmp_path: Path, name: str, coordinator_config, steps: int, every: int, max_failures: int, vocab_size: int, **failures):
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    log_dir = tmp_path / "logs"
    log_dir.mkdir(exist_ok=True)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={
            "data": loop_config(coordinator_config, timeout_s=failures.pop("timeout_s", TIMEOUT_S)),
            "steps": steps, "every": every, "log_dir": str(log_dir), "vocab_size": vocab_size, **failures,
        },
        scaling_config=ScalingConfig(num_workers=coordinator_config.parallel_layout.dp, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "storage"), failure_config=FailureConfig(max_failures=max_failures)),
    )
    return trainer.fit(), log_dir


@pytest.fixture(scope="module")
def vocab_size(tokenizer) -> int:
    return len(tokenizer)


def _check_exact(log_dir: Path, expected, steps: int) -> int:
    """Every rank's lineage equals the uninterrupted stream; returns the attempts rank 0 made."""
    for rank in range(len(expected[0])):
        trained, attempts = lineage(log_dir, rank)
        assert sorted(trained) == list(range(1, steps + 1)), f"rank {rank} lineage steps {sorted(trained)}"
        assert [trained[s] for s in range(1, steps + 1)] == [expected[s - 1][rank] for s in range(1, steps + 1)], rank
    return lineage(log_dir, 0)[1]


def _final_model(result) -> dict[str, torch.Tensor]:
    with result.checkpoint.as_directory() as directory:
        return torch.load(Path(directory) / "model.pt", weights_only=True)["model"]


PACKING = {"shuffle_buffer_size": 20, "max_samples_per_sequence": 10, "packing_buffer_size": 8}


def test_a_run_trains_every_step_once_and_its_checkpoint_holds_the_data_state(ray_session, energon_dataset, tokenizer, vocab_size, tmp_path):
    """The default run's Ray Train test (the failures and examples/ray_train.py run in CI): 1 worker, 4
    steps, a checkpoint every 2. The worker trains the uninterrupted stream once, and Train's last
    checkpoint holds the model trained on it and the data state of step 4."""
    ray = ray_session
    steps = 4
    spec, config = train_spec(energon_dataset), runtime_config(1, 1, name="train_coordinator")
    expected, batches = uninterrupted(spec, config, tokenizer, steps)
    with running_coordinator(ray, config, spec) as coordinator:
        result, log_dir = _fit(ray, tmp_path=tmp_path, name="plain", coordinator_config=config, steps=steps, every=2,
                               max_failures=0, vocab_size=vocab_size)
        progress = CoordinatorClient(coordinator, timeout_s=TIMEOUT_S).progress()
    assert result.error is None
    assert _check_exact(log_dir, expected, steps) == 1
    assert progress["rewinds"] == 0 and progress["committed_step"] == steps
    saved = data_state(result.checkpoint)
    assert saved["step"] == steps and len(saved["ranks"]) == 1
    assert torch.equal(_final_model(result)["weight"], replay_model(batches, vocab_size)["weight"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "workers,packed,prefetch_depth,failure",
    [(0, False, 1, {"raise_at": (5, 1)}), (2, True, 2, {"kill_at": (5, 0)})],
    ids=["0-False-1-raise", "2-True-2-sigkill"],
)
def test_worker_failures_restart_from_the_train_checkpoint_exactly(ray_session, energon_dataset, tokenizer, vocab_size, tmp_path, workers, packed, prefetch_depth, failure):
    """At step 5 a worker raises (no Energon workers, unpacked, prefetch 1) or is SIGKILLed holding
    its batch (2 Energon workers, packed, prefetch 2); Train restarts the group from its last
    registered checkpoint and the data rewinds with it. (Rewinds in a row: test_coordinator_rewind.py.)"""
    ray = ray_session
    steps = 8
    spec = train_spec(energon_dataset, workers)
    if packed:
        spec = train_spec(energon_dataset, data_config={"energon": {**PACKING, "num_workers": workers}, "shuffle": True},
                          packing_algorithm="first_fit_decreasing")
    config = runtime_config(DP, prefetch_depth, name="train_coordinator")
    expected, batches = uninterrupted(spec, config, tokenizer, steps)
    with running_coordinator(ray, config, spec) as coordinator:
        result, log_dir = _fit(
            ray, tmp_path=tmp_path, name="failures", coordinator_config=config, steps=steps, every=2,
            max_failures=1, vocab_size=vocab_size, **failure,
        )
        assert result.error is None
        progress = CoordinatorClient(coordinator, timeout_s=TIMEOUT_S).progress()
    assert _check_exact(log_dir, expected, steps) == 2  # the first attempt and the restart
    assert progress["rewinds"] == 1 and progress["committed_step"] == steps
    final = _final_model(result)
    assert torch.isfinite(final["weight"]).all() and not torch.equal(final["weight"], _model(vocab_size).weight)
    assert torch.equal(final["weight"], replay_model(batches, vocab_size)["weight"])


@pytest.mark.slow
def test_a_rerun_driver_resumes_from_the_same_storage_with_a_new_coordinator(ray_session, energon_dataset, tokenizer, vocab_size, tmp_path, chat_conversations):
    """The first driver's run fails for good (max_failures=0) and its coordinator dies with it; a new
    driver starts a new coordinator and reruns fit() with the same name and storage path (1 worker)."""
    from ray.train.v2.api.exceptions import TrainingFailedError

    ray = ray_session
    steps = 8
    spec, config = train_spec(energon_dataset), runtime_config(1, 1, name="train_coordinator")
    expected, batches = uninterrupted(spec, config, tokenizer, steps)
    with running_coordinator(ray, config, spec):
        with pytest.raises(TrainingFailedError, match="injected failure at step 6"):
            _fit(ray, tmp_path=tmp_path, name="rerun", coordinator_config=config, steps=steps, every=2,
                 max_failures=0, vocab_size=vocab_size, raise_at=(6, 0))
    with running_coordinator(ray, config, spec) as coordinator:  # the new driver's coordinator
        result, log_dir = _fit(ray, tmp_path=tmp_path, name="rerun", coordinator_config=config, steps=steps,
                               every=2, max_failures=0, vocab_size=vocab_size)
        progress = CoordinatorClient(coordinator, timeout_s=TIMEOUT_S).progress()
    assert _check_exact(log_dir, expected, steps) == 2
    assert progress["rewinds"] == 0 and progress["origin_step"] in (2, 4)  # a fresh coordinator, restored once
    assert torch.equal(_final_model(result)["weight"], replay_model(batches, vocab_size)["weight"])

    # a third driver reruns the same storage with the coordinator on other data: refused with the
    # diff before any step is handed out
    other = write_chat_dataset(tmp_path / "other", chat_conversations[240:480], samples_per_shard=12)
    with running_coordinator(ray, config, train_spec(other)) as coordinator:
        with pytest.raises(TrainingFailedError, match=r"rank 0: Energon loader identity changed: dataset.index_uuid"):
            _fit(ray, tmp_path=tmp_path, name="rerun", coordinator_config=config, steps=steps + 2, every=2,
                 max_failures=0, vocab_size=vocab_size)
        assert CoordinatorClient(coordinator, timeout_s=TIMEOUT_S).progress()["handed_step"] == 0


@pytest.mark.slow
def test_a_coordinator_timeout_is_a_worker_failure_train_retries(ray_session, energon_dataset, vocab_size, tmp_path):
    """A rank that takes 6 s per batch, a worker that waits 2 s: each attempt fails with a
    CoordinatorTimeoutError naming the coordinator and the step; Train retries once, then gives up."""
    from ray.train.v2.api.exceptions import TrainingFailedError

    ray = ray_session
    config = runtime_config(1, 0, name="slow_coordinator", injected_delay_s={0: 6.0})
    with running_coordinator(ray, config, train_spec(energon_dataset)):
        with pytest.raises(TrainingFailedError) as caught:
            _fit(ray, tmp_path=tmp_path, name="timeout", coordinator_config=config, steps=3, every=2,
                 max_failures=1, vocab_size=vocab_size, timeout_s=2.0)
    # the retry's restore to the origin waits behind the slow step and times out too
    assert re.search(
        r"CoordinatorTimeoutError: the rl_data coordinator 'slow_coordinator' did not finish "
        r"(handing out step 1|restoring the data state) within 2 s \(DP rank 0\); Ray Train counts this",
        str(caught.value),
    ), str(caught.value)[-2000:]
    attempts = (tmp_path / "logs" / "attempts.jsonl").read_text().splitlines()
    assert len(attempts) == 2  # the first attempt and Train's one retry


def test_a_train_checkpoint_without_a_data_state_is_refused(tmp_path):
    from ray.train import Checkpoint

    (tmp_path / "model.pt").write_bytes(b"weights")
    with pytest.raises(FileNotFoundError, match=r"holds no rl_data data state \(rl_data_state.pt\); it was not saved through TrainData.report\(save=...\) on DP rank 0"):
        data_state(Checkpoint.from_directory(str(tmp_path)))


def test_the_loop_config_is_checked_and_names_the_coordinator():
    config = runtime_config(DP, 1, name="named")
    assert loop_config(config, timeout_s=5) == {"name": "named", "namespace": "rl_data_tests", "dp": DP, "timeout_s": 5.0}
    with pytest.raises(ValueError, match="timeout_s must be > 0 seconds"):
        loop_config(config, timeout_s=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: this machine has no GPU (the copy path is batch_to_device's, tested in test_transfer.py)")
def test_batches_reach_the_gpu_through_pinned_memory(ray_session, energon_dataset, tmp_path):
    from rl_data.distributed.transfer import fetch_batch

    ray = ray_session
    config = runtime_config(1, 0, name="cuda_coordinator")
    with running_coordinator(ray, config, train_spec(energon_dataset)) as coordinator:
        _, refs = CoordinatorClient(coordinator, timeout_s=TIMEOUT_S).next_step()
        batch = fetch_batch(refs[0], "cuda", timeout=TIMEOUT_S)
    assert batch["input_ids"].is_cuda
