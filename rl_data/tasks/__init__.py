"""The built-in tasks, one module per sample kind, and the task API users write tasks with.

``from rl_data.tasks import Task, TaskConfig, SampleSchema, AdapterSpec, register_task, get_task``:
the contract (:mod:`rl_data.task_contract`) and the registry (:mod:`rl_data.task_registry`) are
re-exported here. The built-in task modules (``chat_sft``, ``vlm_sft``, ``preference``,
``rl_prompt``) each define ``TASK``; the registry imports them by name on first lookup.
"""

from __future__ import annotations

from rl_data.task_contract import AdapterSpec, DemoData, SampleSchema, Task, TaskConfig
from rl_data.task_registry import (
    BUILTIN_TASK_MODULES,
    find_schema,
    get_task,
    register_task,
    registered_tasks,
    sample_schemas,
    schema_for_kind,
    tasks_for_kind,
)

__all__ = [
    "BUILTIN_TASK_MODULES",
    "AdapterSpec",
    "DemoData",
    "SampleSchema",
    "Task",
    "TaskConfig",
    "find_schema",
    "get_task",
    "register_task",
    "registered_tasks",
    "sample_schemas",
    "schema_for_kind",
    "tasks_for_kind",
]
