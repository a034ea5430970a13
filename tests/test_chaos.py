"""Seeded chaos: rank kills, client timeouts, rewinds and whole-runtime crashes never lose, repeat or reorder a sample.

A trainer loop takes steps through a ``CoordinatorClient`` (asking for the step it expects),
commits every trained step and saves a checkpoint every ``CHECKPOINT_EVERY`` steps. At
seeded points of the step cycle the test kills a rank actor, lets a next_step call time out
on the client's side, kills the coordinator (with its ranks) and restores the last checkpoint
into a fresh one (a crash), or restores it into the live coordinator (a rewind: a framework
restart that keeps the data runtime); the trainer then drops the steps it trained after that
checkpoint, as it would when it restores its model checkpoint. The final record
(step -> per-rank sample ids) must equal an uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from typing import Any

import pytest

from distributed_fixtures import ENERGON_WORKERS, TIMEOUT_S, reference_stream, runtime_config, train_spec
from rl_data.distributed.client import CoordinatorClient, wait_until_name_is_free
from rl_data.distributed.coordinator import start_data_coordinator

SEED = 20240611
STEPS = 12
CHECKPOINT_EVERY = 3
#: Batches per virtual epoch (odd, so epochs and checkpoints do not line up): STEPS spans 4 loops.
EPOCH_BATCHES = 3
KILL_PHASES = ("before next_step", "after next_step, before fetch", "after fetch, before commit")
RESTORE_PHASES = ("before next_step", "after fetch, before commit")
#: How the last checkpoint is restored: into a fresh coordinator, or into the live one.
RESTORES = ("crash", "rewind")


def _fault_plan(rng: random.Random) -> dict[int, tuple[str, Any]]:
    """step -> (fault, detail): a crash and a rewind after the first checkpoint (one per phase),
    3 rank kills (one per phase), 1-2 client timeouts, at seeded steps and ranks.

    Kills come before the last step, so the next next_step notices each one.
    """
    steps = list(range(1, STEPS))
    rng.shuffle(steps)
    restore_steps = [s for s in steps if s > CHECKPOINT_EVERY][:2]
    plan: dict[int, tuple[str, Any]] = dict(zip(restore_steps, zip(RESTORES, rng.sample(RESTORE_PHASES, 2))))
    free = [s for s in steps if s not in plan]
    kill_phases = rng.sample(KILL_PHASES, 3)
    for step, phase in zip(free, kill_phases):
        plan[step] = ("kill rank", (rng.randrange(2), phase))
    for step in free[len(kill_phases) : len(kill_phases) + rng.choice((1, 2))]:
        plan[step] = ("client timeout", None)
    return plan


class _Runtime:
    """The coordinator the trainer talks to; crashes and restarts it like a job restart would."""

    def __init__(self, ray: Any, config: Any, spec: Any) -> None:
        self.ray, self.config, self.spec = ray, config, spec
        self.handle = start_data_coordinator(config, spec)
        self.kills = 0  # rank kills since this coordinator started

    def client(self) -> CoordinatorClient:
        return CoordinatorClient(self.handle, timeout_s=TIMEOUT_S)

    def kill_rank(self, rank: int) -> str:
        """Kill rank's current actor; one killed earlier and not yet replaced (nothing asked it since) is left dead."""
        name = self.client().status()["rank_actor_names"][rank]
        try:
            actor = self.ray.get_actor(name, namespace=self.config.namespace)
        except ValueError:
            return f"{name} was still dead"
        self.ray.kill(actor, no_restart=True)
        self.kills += 1
        return f"killed {name}"

    def restore(self, checkpoint_dir: str, how: str) -> int:
        """Load the checkpoint: after a crash (kill the coordinator, no shutdown: its ranks die with
        it; start a fresh one), or into the live coordinator (a rewind)."""
        if how == "crash":
            self.ray.kill(self.handle, no_restart=True)
            wait_until_name_is_free(self.config.name, self.config.namespace, TIMEOUT_S)
            self.handle = start_data_coordinator(self.config, self.spec)
            self.kills = 0
        return self.ray.get(self.handle.load_checkpoint.remote(checkpoint_dir), timeout=TIMEOUT_S)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ray.get(self.handle.shutdown.remote(), timeout=TIMEOUT_S)
        self.ray.kill(self.handle, no_restart=True)
        wait_until_name_is_free(self.config.name, self.config.namespace, TIMEOUT_S)


def _accounting(trained: dict[int, list[list[str]]], expected: list[list[list[str]]]) -> dict[str, Any]:
    """Missing and duplicated ids (as multisets) and steps whose batches differ from the reference's."""
    want = Counter(i for step in expected for rank in step for i in rank)
    got = Counter(i for step in trained.values() for rank in step for i in rank)
    return {
        "missing ids": sorted((want - got).elements()),
        "duplicated ids": sorted((got - want).elements()),
        "missing steps": [s for s in range(1, len(expected) + 1) if s not in trained],
        "extra steps": sorted(s for s in trained if not 1 <= s <= len(expected)),
        "reordered steps": [s for s in sorted(trained) if 1 <= s <= len(expected) and trained[s] != expected[s - 1]],
    }


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("workers", ENERGON_WORKERS)
def test_seeded_chaos_trains_every_step_exactly_once_after_the_checkpoint(
    ray_session, energon_dataset, tokenizer, tmp_path, workers
):
    from ray.exceptions import GetTimeoutError

    ray = ray_session
    source = {"path": energon_dataset.path, "split": "train", "virtual_epoch_length": EPOCH_BATCHES}
    spec = train_spec(energon_dataset, workers, source=source)
    config = runtime_config(2, 2, name="chaos_coordinator", max_rank_restarts=STEPS)
    expected = reference_stream(spec, config, tokenizer, STEPS)
    rng = random.Random(SEED + workers)
    plan = _fault_plan(rng)
    checkpoint_dir, checkpoint_step = str(tmp_path / "checkpoint"), 0
    trained: dict[int, list[list[str]]] = {}
    log: list[str] = [f"seed {SEED + workers}, plan {sorted(plan.items())}"]

    runtime = _Runtime(ray, config, spec)
    try:
        client = runtime.client()
        while (step := client.expected_step()) <= STEPS:
            fault, detail = plan.pop(step, (None, None))
            rank, phase = detail if fault == "kill rank" else (None, detail)
            if fault:
                log.append(f"step {step}: {fault} {detail}")

            if fault in RESTORES and phase == "before next_step":
                assert runtime.restore(checkpoint_dir, fault) == checkpoint_step
                trained = {s: ids for s, ids in trained.items() if s <= checkpoint_step}
                client = runtime.client()
                assert client.expected_step() == checkpoint_step + 1
                continue
            if fault == "kill rank" and phase == KILL_PHASES[0]:
                log.append(f"step {step}: {runtime.kill_rank(rank)}")
            if fault == "client timeout":
                hasty = CoordinatorClient(runtime.handle, timeout_s=0.001)
                hasty.redeliver_from(step)
                try:
                    hasty.next_step()
                    log.append(f"step {step}: the hasty client got its answer in time")
                except GetTimeoutError:
                    pass

            got, refs = client.next_step()
            assert got == step, f"asked for step {step}, got {got}; " + "; ".join(log)
            if fault == "kill rank" and phase == KILL_PHASES[1]:
                log.append(f"step {step}: {runtime.kill_rank(rank)}")
            batches = [client.fetch(ref, "cpu") for ref in refs]
            trained[step] = [list(batch["source_ids"]) for batch in batches]
            if fault == "kill rank" and phase == KILL_PHASES[2]:
                log.append(f"step {step}: {runtime.kill_rank(rank)}")

            if fault in RESTORES:  # trained, never committed: the restart loses it with the model
                assert runtime.restore(checkpoint_dir, fault) == checkpoint_step
                trained = {s: ids for s, ids in trained.items() if s <= checkpoint_step}
                client = runtime.client()
                continue
            client.commit(step)
            if step % CHECKPOINT_EVERY == 0:
                client.save_checkpoint(checkpoint_dir)
                checkpoint_step = step

        status = client.status()
    finally:
        runtime.close()

    context = "; ".join(log)
    assert not plan, f"faults never injected: {plan}"
    assert sum("killed" in line for line in log) >= 3, f"fewer than 3 rank actors were killed: {context}"
    report = _accounting(trained, expected)
    assert all(not found for found in report.values()), f"{report}; {context}"
    assert [trained[s] for s in range(1, STEPS + 1)] == expected, context
    assert (status["committed_step"], status["recovering_ranks"]) == (STEPS, []), context
    assert sum(status["restarts"]) == runtime.kills, f"restarts {status['restarts']}, kills {runtime.kills}; {context}"
