"""``chat_sft``: multi-turn text conversations (OpenAI messages, optional tools) for SFT.

Stored kind ``"sft"``: ``{"kind": "sft", "messages": [...], "tools"?: [...]}``. The schema is
shared with ``vlm_sft`` (media content parts are what differ).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rl_data.demo_data import write_chitchat_rows
from rl_data.energon.sample_validation import validate_conversation
from rl_data.energon.task_encoders.chat_sft import ChatSFTTaskEncoder
from rl_data.energon.task_encoders.cookers import ChatCooker
from rl_data.task_contract import DemoData, SampleSchema, Task


def _validate(sample: Mapping[str, Any], media: bool) -> None:
    validate_conversation(sample.get("messages"), where="", media=media)


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
        write_raw_rows=write_chitchat_rows,
        adapter="openai",
    ),
)
