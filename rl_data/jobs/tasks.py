"""The tasks the main SFT job can run: registered tasks (:mod:`rl_data.tasks`) with demo data.

The job writes a task's raw rows (:attr:`rl_data.tasks.DemoData.write_raw_rows`), preprocesses
them with its adapter and loads them with the task's encoder; ``--task NAME`` picks one. A task
whose batches carry no SFT message logs (``rl_prompt``) is fed by the GRPO-shaped jobs instead.
"""

from __future__ import annotations

from rl_data.task_contract import Task
from rl_data.task_registry import get_task, registered_tasks

#: Tasks whose batches the SFT job's training actors cannot train on.
_NOT_SFT = frozenset({"rl_prompt"})


def sft_demo_tasks() -> list[str]:
    """Names of the registered tasks the SFT job can run."""
    return sorted(name for name, task in registered_tasks().items() if task.demo is not None and name not in _NOT_SFT)


def sft_demo_task(name: str) -> Task:
    """The task ``name``, if the SFT job can run it (``ValueError`` naming the choices otherwise)."""
    if name not in registered_tasks() and ":" not in name:
        raise ValueError(f"unknown task {name!r}; choose one of {sft_demo_tasks()}")
    task = get_task(name)
    if task.demo is None or task.name in _NOT_SFT:
        raise ValueError(f"task {name!r} has no SFT demo data; choose one of {sft_demo_tasks()}")
    return task
