"""``python -m benchmarks.coordinator_tree [G] [K]``: would a tree of sub-coordinators cut the coordinator's cost per step?

Bare Ray, no rl_data: G rank actors return a batch (8 x 4,096 int32) and a 40 KB state per call (two
caller-owned returns). **direct**: the coordinator calls every rank and waits for the states (what
``DataCoordinator`` does). **tree**: the coordinator calls G / K group actors; each calls its K ranks
and returns their batch refs (owned by the group, borrowed by the coordinator) and states. Prints the
CPU per step of the coordinator and of the groups (psutil), and the hand-out latency (issue 37: the
coordinator's CPU per step at G = 128 against a 25 ms target).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from typing import Any

STEPS, WARMUP = 30, 3
STATE = {"filler": "x" * 40_000}


class Rank:
    def __init__(self) -> None:
        from array import array

        self.batch = {"token_ids": [array("i", range(4096)) for _ in range(8)]}

    async def next_batch(self) -> tuple[Any, dict[str, Any]]:
        return self.batch, STATE


class Group:
    def __init__(self, ranks: list[Any]) -> None:
        self.ranks = ranks

    def pid(self) -> int:
        return os.getpid()

    async def next_batches(self) -> tuple[list[Any], list[Any]]:
        calls = [rank.next_batch.options(num_returns=2).remote() for rank in self.ranks]
        states = await asyncio.gather(*(state for _, state in calls))
        return [batch for batch, _ in calls], states


class Coordinator:
    def __init__(self, ranks: list[Any], groups: list[Any]) -> None:
        self.ranks, self.groups, self.pending = ranks, groups, []

    def pid(self) -> int:
        return os.getpid()

    async def next_step(self, tree: bool) -> list[Any]:
        import ray

        if tree:
            replies = await asyncio.gather(*(group.next_batches.remote() for group in self.groups))
            refs = [ref for batch_refs, _ in replies for ref in batch_refs]
        else:
            calls = [rank.next_batch.options(num_returns=2).remote() for rank in self.ranks]
            state_refs = [state for _, state in calls]
            await asyncio.get_running_loop().run_in_executor(None, lambda: ray.get(state_refs))
            refs = [batch for batch, _ in calls]
        self.pending = (self.pending + [refs])[-2:]  # a commit drops the older steps' refs
        return refs


def main(argv: list[str]) -> None:
    import psutil
    import ray

    world, group_size = (int(argv[0]) if argv else 32), (int(argv[1]) if len(argv) > 1 else 8)
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    ranks = [ray.remote(Rank).options(num_cpus=0).remote() for _ in range(world)]
    groups = [ray.remote(Group).options(num_cpus=0).remote(ranks[i : i + group_size]) for i in range(0, world, group_size)]
    coordinator = ray.remote(Coordinator).options(num_cpus=0).remote(ranks, groups)
    coordinator_process = psutil.Process(ray.get(coordinator.pid.remote()))
    group_processes = [psutil.Process(pid) for pid in ray.get([group.pid.remote() for group in groups])]

    def cpu(processes: list[Any]) -> float:
        return sum(sum(process.cpu_times()[:2]) for process in processes)

    for tree in (False, True, False, True):
        for _ in range(WARMUP):
            ray.get(coordinator.next_step.remote(tree))
        coordinator_before, groups_before, latencies = cpu([coordinator_process]), cpu(group_processes), []
        for _ in range(STEPS):
            started = time.perf_counter()
            refs = ray.get(coordinator.next_step.remote(tree))
            ray.get(refs[:2])  # a trainer fetches its batches
            latencies.append(time.perf_counter() - started)
        print(f"G={world} K={group_size} {'tree' if tree else 'direct':6s} coordinator CPU "
              f"{1e3 * (cpu([coordinator_process]) - coordinator_before) / STEPS:6.1f} ms/step, groups "
              f"{1e3 * (cpu(group_processes) - groups_before) / STEPS:6.1f} ms/step, hand-out p50 "
              f"{1e3 * statistics.median(latencies):6.1f} ms, load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
