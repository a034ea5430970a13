"""Import a rank actor's loader stack ahead of time, in Ray's idle worker processes.

A Ray actor starts in one of the raylet's idle worker processes (it prestarts about one per core
and does not refill them; later actors get a new process). A rank actor then spends ~1.5-2 CPU-s
importing torch, Megatron-Energon, transformers' tokenizer class and this project's loaders
before it builds anything; with every rank and the coordinator starting at once that is most of
the time to the first step. Ray can import modules
in each worker process before it accepts work (the raylet's ``preload_python_modules``): name
this module there and those imports are done while the worker waits in the pool::

    RAY_preload_python_modules=rl_data.distributed.preload ray start --head ...
    ray.init(_system_config={"preload_python_modules": ["rl_data.distributed.preload"]})  # local Ray

Every Python worker of that raylet then holds these modules: measured here, an idle worker took
2.4-2.6 CPU-s to start instead of 0.4 and holds 215 MB of its own memory instead of 42 (USS; 464
MB resident). Nothing else changes: a worker without them imports them on first use, as before.
The order and content of batches do not depend on it.
"""

from __future__ import annotations

import importlib
import logging

logger = logging.getLogger(__name__)

#: The Ray system-config entry that makes every worker process import this module at its start.
SYSTEM_CONFIG = {"preload_python_modules": [__name__]}
#: What a rank actor imports before its first batch (the default task's encoder included: tasks
#: are imported on first use), and what the coordinator imports for the rank states.
MODULES = (
    "torch",
    "tiktoken",
    "transformers.tokenization_utils_fast",
    "rl_data.distributed.coordinator",
    "rl_data.distributed.rank_actor",
    "rl_data.energon.sft_dataloader",
    "rl_data.tokenization.tokenizer",
    "rl_data.tasks.chat_sft",
)


def preload(modules: tuple[str, ...] = MODULES) -> dict[str, str]:
    """Import ``modules``; return ``{module: error}`` for those that failed (each also logged).

    Never raises: a worker process that ran this still starts (Ray runs it in every worker of the
    raylet, whatever job it serves), and a module that failed here fails where it is used.
    """
    failed = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 (an OSError from a shared library too)
            failed[name] = f"{type(error).__name__}: {error}"
            logger.warning(
                "rl_data preload: could not import %s (%s); it is imported on first use instead", name, failed[name]
            )
    return failed


preload()
