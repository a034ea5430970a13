"""One seeded async-GRPO scenario, run against any prompt source, and its prompt accounting.

A discrete-event simulation on a virtual clock (no sleeping), the same for every source:
``workers`` rollout workers each take ``take`` prompts when idle and the window has room
(at most ``window`` prompts out: the loop oversamples); a prompt's group finishes after the
stand-in policy's latency for it (out of order); a generation fails with probability
``failure_rate`` (the prompt is released and comes back); a group whose rollouts all got the
same reward is dropped (dynamic sampling); every ``groups_per_step`` finished groups make a
training step, after which they are acked; every ``checkpoint_every`` steps the source and
the trainer's record are checkpointed; at each step of ``crash_after_steps`` (once each)
everything in memory is lost and the run restarts from the last checkpoint (the record rolls
back with it). The run ends when the source hands out a prompt of epoch ``epochs + 1``, or
when the record covers every prompt of the first ``epochs`` epochs.

:func:`account` then counts, per epoch of the first ``epochs``: prompts never resolved
(missing), and resolutions beyond the first of the same prompt (duplicated).
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rl_data.jobs.grpo.policy import StandInPolicy, hashed_unit


@dataclass(frozen=True)
class Scenario:
    epochs: int = 2
    workers: int = 4
    take: int = 4
    window: int = 32
    groups_per_step: int = 8
    checkpoint_every: int = 4
    crash_after_steps: tuple[int, ...] = (10, 23)
    failure_rate: float = 0.05
    seed: int = 0


def run_scenario(source: Any, scenario: Scenario, keys: list[str], checkpoint_dir: str) -> dict[str, Any]:
    """Drive ``source`` through ``scenario``; return the record and the counters."""
    policy = StandInPolicy(seed=scenario.seed, group_size=4, latency_s=1.0)
    expected = len(keys)
    record: list[tuple[tuple[int, int], str, str]] = []
    saved = (source.checkpoint(f"{checkpoint_dir}/step_0"), [], 0)
    crashes, step, clock, sequence = set(scenario.crash_after_steps), 0, 0.0, 0
    events: list[tuple[float, int, int, Any]] = []  # (finish time, tie-break, worker, prompt)
    busy: Counter = Counter()  # worker -> prompts in flight
    buffer: list[Any] = []
    attempts: Counter = Counter()
    counts = Counter()
    furthest_epoch = 0

    def complete() -> bool:
        resolved = Counter(uid[0] for uid, _, _ in record)
        return all(resolved[e] >= expected for e in range(scenario.epochs))

    while furthest_epoch <= scenario.epochs and not complete():
        for worker in range(scenario.workers):
            room = scenario.window - sum(busy.values()) - len(buffer)
            if busy[worker] == 0 and room > 0:
                for prompt in source.take(min(scenario.take, room)):
                    furthest_epoch = max(furthest_epoch, prompt[0][0])
                    counts["taken"] += 1
                    sequence += 1
                    heapq.heappush(events, (clock + policy.group_latency_s(prompt[1]), sequence, worker, prompt))
                    busy[worker] += 1
        clock, _, worker, prompt = heapq.heappop(events)
        busy[worker] -= 1
        uid, key, payload = prompt
        attempts[key] += 1
        if hashed_unit(scenario.seed, "fail", key, attempts[key]) < scenario.failure_rate:
            source.release([uid])
            counts["released"] += 1
            continue
        truth = str(payload["extra_env_info"]["ground_truth"])
        rewards = {response.endswith(f"#### {truth}") for response in policy.responses(key, truth)}
        if len(rewards) == 1:
            source.drop([uid], "uniform_reward")
            record.append((uid, key, "uniform_reward"))
            continue
        buffer.append(prompt)
        while len(buffer) >= scenario.groups_per_step:
            trained, buffer = buffer[: scenario.groups_per_step], buffer[scenario.groups_per_step :]
            source.ack([p[0] for p in trained])
            record.extend((p[0], p[1], "trained") for p in trained)
            step += 1
            if step % scenario.checkpoint_every == 0:
                saved = (source.checkpoint(f"{checkpoint_dir}/step_{step}"), list(record), step)
            if step in crashes:
                crashes.discard(step)
                counts["crashes"] += 1
                counts["rolled_back"] += len(record) - len(saved[1])
                source.restart(saved[0])
                record, step = list(saved[1]), saved[2]
                events.clear()
                busy.clear()
                buffer = []
                break
    return {"record": record, "counts": dict(counts), "steps": step}


def account(record: list[tuple[tuple[int, int], str, str]], keys: list[str], epochs: int) -> dict[str, Any]:
    """Missing and duplicated prompts per epoch (by prompt key) of the record."""
    per_epoch = []
    for epoch in range(epochs):
        resolved = Counter(key for uid, key, _ in record if uid[0] == epoch)
        per_epoch.append({
            "epoch": epoch,
            "missing": sum(1 for key in keys if key not in resolved),
            "duplicated": sum(n - 1 for n in resolved.values()),
        })  # fmt: skip
    return {
        "epochs": per_epoch,
        "missing": sum(e["missing"] for e in per_epoch),
        "duplicated": sum(e["duplicated"] for e in per_epoch),
    }
