"""The data tasks the main job can run: which raw data it prepares and how it is encoded.

A :class:`DemoTask` names everything that differs between tasks: the data it writes as raw
JSONL rows (real chitchat conversations, preference pairs made from them, or synthetic pictures
with questions; see :mod:`rl_data.jobs.task_data`), the preprocess adapter that reads those
rows, the task encoder (and cooker) the rank actors' loaders use and the processor they build.
``--task NAME`` selects one of :data:`TASKS`; add a task by adding an entry.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from rl_data.jobs.task_data import write_chitchat_preference_rows, write_shape_question_rows

TOKENIZER_FACTORY = "rl_data.tokenization.tokenizer:load_qwen3_tokenizer"
MULTIMODAL_PROCESSOR_FACTORY = "rl_data.energon.multimodal.task_encoders.processor:load_default_multimodal_processor"

@dataclass(frozen=True)
class DemoTask:
    """One selectable task of the main job."""

    name: str
    description: str
    #: ``(path, n)`` -> writes up to ``n`` raw rows as JSONL to ``path``, returns the rows written.
    write_raw_rows: Callable[[Path, int], int]
    #: Preprocess adapter that turns those rows into canonical samples.
    adapter: str
    #: ``EnergonLoaderConfig.task_encoder`` of the rank actors' loaders.
    task_encoder: str
    #: ``EnergonLoaderConfig.cooker`` (None: the task encoder's default).
    cooker: Optional[str] = None
    #: ``LoaderSpec.processor_factory``: the tokenizer, or a multimodal processor.
    processor_factory: str = TOKENIZER_FACTORY
    #: Whether the task encoder packs sequences (``--packing``).
    supports_packing: bool = True


def write_chitchat_rows(path: Path, limit: int) -> int:
    """The first ``limit`` chitchat conversations as OpenAI ``{"messages": [...]}`` rows."""
    from rl_data.sample_data import chitchat_conversations

    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with path.open("w", encoding="utf-8") as out:
        for conversation in chitchat_conversations(limit=limit):
            out.write(json.dumps({"messages": conversation["messages"]}, ensure_ascii=False) + "\n")
            written += 1
    return written


TASKS: dict[str, DemoTask] = {
    "chat_sft": DemoTask(
        name="chat_sft",
        description="multi-turn chat SFT on the chitchat conversations (chitchat-dataset wheel)",
        write_raw_rows=write_chitchat_rows,
        adapter="openai",
        task_encoder="chat_sft",
    ),
    "vlm_sft": DemoTask(
        name="vlm_sft",
        description="image question answering on synthetic pictures of coloured shapes (PNG files + JSONL)",
        write_raw_rows=write_shape_question_rows,
        adapter="openai",
        task_encoder="vlm_sft",
        processor_factory=MULTIMODAL_PROCESSOR_FACTORY,
    ),
    "preference": DemoTask(
        name="preference",
        description="preference pairs from chitchat: the real reply chosen, another conversation's rejected",
        write_raw_rows=write_chitchat_preference_rows,
        adapter="preference",
        task_encoder="preference",
        supports_packing=False,
    ),
}


def get_task(name: str) -> DemoTask:
    """The task registered as ``name``."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASKS)}") from None
