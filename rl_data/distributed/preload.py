"""Import a rank actor's loader stack ahead of time, in Ray's idle worker processes.

A Ray actor starts in one of the raylet's idle worker processes (it starts one per CPU with the
node and does not refill them; later actors get a new process). A rank actor then spends ~1.5-2 CPU-s importing torch, Megatron-Energon, transformers'
tokenizer class and this project's loaders before it builds anything; with every rank and the
coordinator starting at once that is most of the time to the first step. Ray can import modules
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

import torch  # noqa: F401
import tiktoken  # noqa: F401
from transformers import PreTrainedTokenizerFast  # noqa: F401

import rl_data.distributed.coordinator  # noqa: F401
import rl_data.distributed.rank_actor  # noqa: F401
import rl_data.energon.sft_dataloader  # noqa: F401
from rl_data.tasks import get_task

#: The Ray system-config entry that makes every worker process import this module at its start.
SYSTEM_CONFIG = {"preload_python_modules": [__name__]}

get_task("chat_sft")  # the default task's encoder module (tasks are imported on first use)
