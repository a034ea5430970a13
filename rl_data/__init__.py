"""rl_data: a Ray-based, checkpointable data pipeline for LLM post-training.

This module is the public facade: every name a user needs, listed in ``__all__``, each marked
``stable`` (changes only with a deprecation period of one release) or ``beta`` (may change in a
minor release, said in the changelog) in :data:`_PUBLIC` below. Everything else is internal: it
stays importable under its own module, but is not part of the API.

Public modules besides this one: ``rl_data.interfaces`` and ``rl_data.energon.sft_dataloader``
(NeMo-RL's names and signatures), ``rl_data.integrations.ray_train`` and
``rl_data.integrations.trl`` (optional extras ``train`` and ``trl``).

Names are imported on first use, so ``import rl_data`` imports neither Ray nor torch.
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

__version__ = "0.1.0"

_STABLE, _BETA = "stable", "beta"

#: Public name -> (the module that defines it, its stability). The reference docs and
#: ``tests/test_public_api.py`` (against the checked-in ``tests/data/public_api.txt``) read it.
_PUBLIC: dict[str, tuple[str, str]] = {
    # Configs
    "RuntimeConfig": ("rl_data.distributed.config", _STABLE),
    "ParallelLayout": ("rl_data.distributed.config", _STABLE),
    "LoaderSpec": ("rl_data.energon.loader_spec", _STABLE),
    "FeedConfig": ("rl_data.prompt_feed.feed", _BETA),
    "PreprocessConfig": ("rl_data.preprocess.pipeline", _STABLE),
    "ConfigError": ("rl_data.config_blocks", _STABLE),
    # The coordinator (lockstep training steps)
    "start_data_coordinator": ("rl_data.distributed.coordinator", _STABLE),
    "attach": ("rl_data.distributed.client", _STABLE),
    "get_coordinator": ("rl_data.distributed.client", _STABLE),
    "CoordinatorClient": ("rl_data.distributed.client", _STABLE),
    "StepPrefetcher": ("rl_data.distributed.step_prefetcher", _STABLE),
    "fetch_batch": ("rl_data.distributed.transfer", _STABLE),
    "batch_to_device": ("rl_data.distributed.transfer", _STABLE),
    "CoordinatorNotFoundError": ("rl_data.distributed.client", _STABLE),
    "RankFailedError": ("rl_data.distributed.rank_pool", _STABLE),
    "RankTimeoutError": ("rl_data.distributed.rank_pool", _STABLE),
    "RestoreIncompleteError": ("rl_data.distributed.rank_pool", _STABLE),
    "DataExhaustedError": ("rl_data.distributed.rank_actor", _STABLE),
    "CheckpointFileError": ("rl_data.distributed.checkpoint_files", _STABLE),
    # The prompt feed (async RL, exactly once per prompt)
    "start_prompt_feed": ("rl_data.prompt_feed.feed", _BETA),
    "attach_feed": ("rl_data.prompt_feed.client", _BETA),
    "get_feed": ("rl_data.prompt_feed.client", _BETA),
    "RolloutClient": ("rl_data.prompt_feed.client", _BETA),
    "TrainerClient": ("rl_data.prompt_feed.client", _BETA),
    "TakenPrompt": ("rl_data.prompt_feed.ledger", _BETA),
    "FeedNotFoundError": ("rl_data.prompt_feed.client", _BETA),
    "UidStateError": ("rl_data.prompt_feed.ledger", _BETA),
    "Outcome": ("rl_data.prompt_feed.outcomes", _BETA),
    "ScheduleConfig": ("rl_data.prompt_feed.schedules", _BETA),
    "DynamicSampler": ("rl_data.prompt_feed.dynamic_sampling", _BETA),
    # Preprocess
    "run_preprocess": ("rl_data.preprocess.pipeline", _STABLE),
    "PreprocessSummary": ("rl_data.preprocess.pipeline", _STABLE),
    # Batches and the single-process loader (NeMo-RL's API)
    "BatchedDataDict": ("rl_data.batched_data_dict", _STABLE),
    "PackedTensor": ("rl_data.packed_tensor", _STABLE),
    "build_energon_sft_loader": ("rl_data.energon.sft_dataloader", _STABLE),
    "EnergonSFTDataLoader": ("rl_data.energon.sft_dataloader", _STABLE),
    "SFTDataLoader": ("rl_data.energon.sft_dataloader", _STABLE),
    # Tasks: one kind of training sample from raw row to batch
    "Task": ("rl_data.task_contract", _BETA),
    "TaskConfig": ("rl_data.task_contract", _BETA),
    "SampleSchema": ("rl_data.task_contract", _BETA),
    "AdapterSpec": ("rl_data.task_contract", _BETA),
    "DemoData": ("rl_data.task_contract", _BETA),
    "register_task": ("rl_data.task_registry", _BETA),
    "get_task": ("rl_data.task_registry", _BETA),
    # Tokenizers and chat templates
    "load_tokenizer": ("rl_data.tokenization.tokenizer", _STABLE),
    "load_qwen3_tokenizer": ("rl_data.tokenization.tokenizer", _STABLE),
    "build_qwen3_tokenizer": ("rl_data.tokenization.tokenizer", _STABLE),
    "tokenizer_with_template": ("rl_data.tokenization.templates", _BETA),
    "formatting_path": ("rl_data.tokenization.chat", _BETA),
    "get_formatted_message_log": ("rl_data.tokenization.chat", _STABLE),
    # Data that installs offline (examples, smoke tests) and reward checks
    "chitchat_conversations": ("rl_data.sample_data", _BETA),
    "write_gsm8k_rows": ("rl_data.prompt_data", _BETA),
    "arithmetic_word_problems": ("rl_data.prompt_data", _BETA),
    "human_eval_prompts": ("rl_data.prompt_data", _BETA),
    "math_reward": ("rl_data.rewards", _BETA),
}

#: The other public modules (their own ``__all__``) -> their stability.
_PUBLIC_MODULES: dict[str, str] = {
    "rl_data.interfaces": _STABLE,
    "rl_data.energon.sft_dataloader": _STABLE,
    "rl_data.integrations.ray_train": _BETA,
    "rl_data.integrations.trl": _BETA,
}

__all__ = sorted(_PUBLIC)

if _TYPE_CHECKING:  # what static tools (IDEs, type checkers) see; tests/test_public_api.py keeps it equal to _PUBLIC
    from rl_data.batched_data_dict import BatchedDataDict
    from rl_data.config_blocks import ConfigError
    from rl_data.distributed.checkpoint_files import CheckpointFileError
    from rl_data.distributed.client import CoordinatorClient, CoordinatorNotFoundError, attach, get_coordinator
    from rl_data.distributed.config import ParallelLayout, RuntimeConfig
    from rl_data.distributed.coordinator import start_data_coordinator
    from rl_data.distributed.rank_actor import DataExhaustedError
    from rl_data.distributed.rank_pool import RankFailedError, RankTimeoutError, RestoreIncompleteError
    from rl_data.distributed.step_prefetcher import StepPrefetcher
    from rl_data.distributed.transfer import batch_to_device, fetch_batch
    from rl_data.energon.loader_spec import LoaderSpec
    from rl_data.energon.sft_dataloader import EnergonSFTDataLoader, SFTDataLoader, build_energon_sft_loader
    from rl_data.packed_tensor import PackedTensor
    from rl_data.preprocess.pipeline import PreprocessConfig, PreprocessSummary, run_preprocess
    from rl_data.prompt_data import arithmetic_word_problems, human_eval_prompts, write_gsm8k_rows
    from rl_data.prompt_feed.client import FeedNotFoundError, RolloutClient, TrainerClient, attach_feed, get_feed
    from rl_data.prompt_feed.dynamic_sampling import DynamicSampler
    from rl_data.prompt_feed.feed import FeedConfig, start_prompt_feed
    from rl_data.prompt_feed.ledger import TakenPrompt, UidStateError
    from rl_data.prompt_feed.outcomes import Outcome
    from rl_data.prompt_feed.schedules import ScheduleConfig
    from rl_data.rewards import math_reward
    from rl_data.sample_data import chitchat_conversations
    from rl_data.task_contract import AdapterSpec, DemoData, SampleSchema, Task, TaskConfig
    from rl_data.task_registry import get_task, register_task
    from rl_data.tokenization.chat import formatting_path, get_formatted_message_log
    from rl_data.tokenization.templates import tokenizer_with_template
    from rl_data.tokenization.tokenizer import build_qwen3_tokenizer, load_qwen3_tokenizer, load_tokenizer


def __getattr__(name: str) -> object:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'rl_data' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_PUBLIC[name][0]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))

