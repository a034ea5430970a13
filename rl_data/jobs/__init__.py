"""Jobs built on the runtime: the main SFT job (``pipelines/train_sft_demo.py``) and its parts.

``sft_demo.run_demo(config.TrainDemoConfig(...))`` runs the whole job on the connected (or a local)
Ray cluster; the modules are small on purpose: options (``config``, ``command`` for typer),
the data each task needs (``tasks``, ``data``), connecting to Ray (``ray_cluster``), the
training actors (``trainer``), the step loop (``steps``), the continuation proof
(``exactness``), the summary (``summary``), the readable view of an encoded conversation
(``encoding_view``) and checkpoint inspection (``inspect_checkpoint``).
"""

from rl_data._moved import moved_names as _moved_names

# Former re-exports (see rl_data/_moved.py).
__getattr__ = _moved_names(
    __name__,
    {
        "TrainDemoConfig": "rl_data.jobs.config",
        "sft_demo_task": "rl_data.jobs.tasks",
        "sft_demo_tasks": "rl_data.jobs.tasks",
    },
)
