"""``vlm_sft``: conversations with image, video and audio parts (stored kind ``"sft"``)."""

from __future__ import annotations

from rl_data.demo_data import write_shape_question_rows
from rl_data.energon.multimodal.task_encoders.vlm_sft import MultimodalChatCooker, VLMSFTTaskEncoder
from rl_data.task_contract import DemoData, Task
from rl_data.tasks.chat_sft import SFT_SCHEMA


TASK = Task(
    name="vlm_sft",
    schema=SFT_SCHEMA,
    encoder_class=VLMSFTTaskEncoder,
    cookers={"multimodal_chat": MultimodalChatCooker},
    needs_processor=True,
    adapters=("openai", "sharegpt"),
    demo=DemoData(
        description="image question answering on synthetic pictures of coloured shapes (PNG files + JSONL)",
        write_raw_rows=write_shape_question_rows,
        adapter="openai",
        processor_factory="rl_data.energon.multimodal.task_encoders.processor:load_default_multimodal_processor",
    ),
)
