"""The built-in tasks, one module per sample kind (internal).

The built-in task modules (``chat_sft``, ``vlm_sft``, ``preference``, ``rl_prompt``) each define
``TASK``; the registry (:mod:`rl_data.task_registry`) imports them by name on first lookup. Users
write tasks with the contract the facade exports: ``from rl_data import Task, TaskConfig, ...``.
"""

from rl_data._moved import moved_names as _moved_names

# Former re-exports (see rl_data/_moved.py).
__getattr__ = _moved_names(
    __name__,
    {
        "AdapterSpec": "rl_data",
        "BUILTIN_TASK_MODULES": "rl_data.task_registry",
        "DemoData": "rl_data",
        "SampleSchema": "rl_data",
        "Task": "rl_data",
        "TaskConfig": "rl_data",
        "find_schema": "rl_data.task_registry",
        "get_task": "rl_data",
        "register_task": "rl_data",
        "registered_tasks": "rl_data.task_registry",
        "sample_schemas": "rl_data.task_registry",
        "schema_for_kind": "rl_data.task_registry",
        "tasks_for_kind": "rl_data.task_registry",
    },
)
