"""The task contract, re-exported under its former path (it lives in :mod:`rl_data.task_contract`)."""

from rl_data.task_contract import TOKENIZER_FACTORY, AdapterSpec, DemoData, SampleSchema, Task, TaskConfig

__all__ = ["TOKENIZER_FACTORY", "AdapterSpec", "DemoData", "SampleSchema", "Task", "TaskConfig"]
