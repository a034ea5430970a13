"""The task registry: every sample kind the project reads, looked up by name or stored kind.

At the bottom of the layers with the contract (:mod:`rl_data.task_contract`): any layer may look
a task up. Built-in tasks are the modules listed in :data:`BUILTIN_TASK_MODULES` (one line per
task, in :mod:`rl_data.tasks`; each defines ``TASK``), imported by name on first lookup, like a
task given by import path: the registry imports no task module when it is imported, and a task
module registers nothing when it is imported. A task outside the package is named by import
path, ``"package.module:ATTRIBUTE"`` (the attribute must be a :class:`Task`); it is imported and
registered wherever it is looked up, so rank actors and preprocess workers on other nodes need
only that module importable.
"""

from __future__ import annotations

import importlib
from typing import Any

from rl_data.import_path import load_object
from rl_data.task_contract import SampleSchema, Task

#: The package of the built-in task modules.
TASKS_PACKAGE = "rl_data.tasks"
#: Built-in task modules, one per task; each defines ``TASK``.
BUILTIN_TASK_MODULES = (
    "rl_data.tasks.chat_sft",
    "rl_data.tasks.vlm_sft",
    "rl_data.tasks.preference",
    "rl_data.tasks.rl_prompt",
)

_TASKS: dict[str, Task] = {}
_builtins_loaded = False


def registered_tasks() -> dict[str, Task]:
    """The built-in tasks (and any registered with :func:`register_task`) by name."""
    global _builtins_loaded
    if not _builtins_loaded:
        for module in BUILTIN_TASK_MODULES:
            register_task(importlib.import_module(module).TASK)
        _builtins_loaded = True
    return dict(_TASKS)


def register_task(task: Task) -> Task:
    """Register ``task`` under its name (again registering the same object is a no-op)."""
    if not isinstance(task, Task):
        raise TypeError(f"register_task expects a rl_data.Task, got {type(task).__name__}")
    existing = _TASKS.get(task.name)
    if existing is not None and existing is not task:
        raise ValueError(f"a different task is already registered as {task.name!r}; pick another name")
    _TASKS[task.name] = task
    return task


def get_task(name: str) -> Task:
    """The task registered as ``name``, or the :class:`Task` at import path ``"pkg.module:ATTR"``."""
    if name in _TASKS:
        return _TASKS[name]
    builtin = f"{TASKS_PACKAGE}.{name}"
    if builtin in BUILTIN_TASK_MODULES:  # import only this task (a rank actor needs one)
        return register_task(importlib.import_module(builtin).TASK)
    if ":" not in str(name):
        tasks = registered_tasks()
        if name in tasks:
            return tasks[name]
        raise ValueError(
            f"unknown task {name!r}; registered tasks are {sorted(tasks)}, or give an import "
            "path 'package.module:ATTRIBUTE' of a rl_data.Task"
        )
    # an import path: the built-in tasks are not imported (a rank actor of this task needs none)
    task = load_object(name, "task")
    if not isinstance(task, Task):
        raise ValueError(f"{name!r} is a {type(task).__name__}, not a rl_data.Task")
    return register_task(task)  # its stored kind is known in this process from now on


def sample_schemas() -> dict[str, SampleSchema]:
    """Every stored sample kind of the registered tasks, by kind."""
    return {task.schema.kind: task.schema for task in registered_tasks().values()}


def find_schema(kind: Any) -> SampleSchema | None:
    """The schema of stored kind ``kind``, or None. Cheap per sample: the built-in tasks are
    imported only for a kind that no task imported so far reads (a rank actor imports one)."""
    if not isinstance(kind, str):
        return None
    for task in _TASKS.values():
        if task.schema.kind == kind:
            return task.schema
    return sample_schemas().get(kind)


def schema_for_kind(kind: Any) -> SampleSchema:
    """The schema of stored kind ``kind`` (``ValueError`` naming the known kinds otherwise)."""
    schema = find_schema(kind)
    if schema is None:
        raise ValueError(f"sample kind {kind!r} is not one of {sorted(sample_schemas())}; set sample['kind']")
    return schema


def tasks_for_kind(kind: str) -> list[str]:
    """Names of the tasks that read stored kind ``kind`` (for error messages)."""
    return sorted(name for name, task in registered_tasks().items() if task.schema.kind == kind)


__all__ = [
    "BUILTIN_TASK_MODULES",
    "find_schema",
    "get_task",
    "register_task",
    "registered_tasks",
    "sample_schemas",
    "schema_for_kind",
    "tasks_for_kind",
]
