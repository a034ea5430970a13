"""The driver's step loop: next step from the coordinator, one batch ref per training actor, commit.

The coordinator hands out refs only; every training actor fetches its own rank's batch. The
driver commits step k after every actor returned from step k, so a checkpoint taken then holds
the loader states after exactly the batches that were consumed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class StepRecord:
    """What the training actors consumed at one step (``per_rank[r]`` is rank r's report)."""

    step: int
    per_rank: list[dict[str, Any]]
    seconds: float

    @property
    def source_ids(self) -> list[list[Any]]:
        """``[rank] -> sample ids`` of this step."""
        return [report["source_ids"] for report in self.per_rank]

    def total(self, key: str) -> int:
        return sum(int(report[key]) for report in self.per_rank)


def run_steps(
    coordinator: Any,
    trainers: list[Any],
    count: int,
    *,
    timeout_s: float,
    on_step: Optional[Callable[[StepRecord], None]] = None,
) -> list[StepRecord]:
    """Run ``count`` steps (each committed once every trainer consumed its batch)."""
    import ray

    records = []
    for _ in range(count):
        started = time.perf_counter()
        step, refs = ray.get(coordinator.next_step.remote(), timeout=timeout_s)
        if len(refs) != len(trainers):
            raise RuntimeError(
                f"the coordinator handed out {len(refs)} batches for {len(trainers)} training "
                "actors; start one training actor per logical rank"
            )
        reports = ray.get(
            [trainer.train_step.remote(step, [ref], timeout_s) for trainer, ref in zip(trainers, refs)],
            timeout=timeout_s,
        )
        ray.get(coordinator.commit.remote(step), timeout=timeout_s)
        record = StepRecord(step=step, per_rank=reports, seconds=time.perf_counter() - started)
        records.append(record)
        if on_step is not None:
            on_step(record)
    return records
