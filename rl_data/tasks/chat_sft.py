"""``chat_sft``: multi-turn text conversations (OpenAI messages, optional tools) for SFT.

Stored kind ``"sft"``: ``{"kind": "sft", "messages": [...], "tools"?: [...]}``. The schema is
shared with ``vlm_sft`` (media content parts are what differ).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rl_data.energon.task_encoders.chat_sft import ChatSFTTaskEncoder
from rl_data.energon.task_encoders.cookers import ChatCooker
from rl_data.tasks.base import DemoData, SampleSchema, Task


def _validate(sample: Mapping[str, Any], media: bool) -> None:
    from rl_data.preprocess.validation import validate_conversation

    validate_conversation(sample.get("messages"), where="", media=media)


def _write_chitchat_rows(path: Any, limit: int) -> int:
    from rl_data.jobs.task_data import write_chitchat_rows

    return write_chitchat_rows(path, limit)


SFT_SCHEMA = SampleSchema(
    kind="sft",
    message_lists=("messages",),
    validate=_validate,
    conversations=lambda sample: [list(sample["messages"])],
)

TASK = Task(
    name="chat_sft",
    schema=SFT_SCHEMA,
    encoder_class=ChatSFTTaskEncoder,
    cookers={"chat": ChatCooker},
    adapters=("openai", "sharegpt", "alpaca", "prompt_response"),
    demo=DemoData(
        description="multi-turn chat SFT on the chitchat conversations (chitchat-dataset wheel)",
        write_raw_rows=_write_chitchat_rows,
        adapter="openai",
    ),
)
