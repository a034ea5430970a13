"""Energon task encoders and cookers for rl_data, selectable by name."""

from __future__ import annotations

from rl_data.energon.task_encoders.adapter import ProcessorAdapter
from rl_data.energon.task_encoders.base import BaseSFTTaskEncoder, EncodedSFTSample, PackedSFTSample
from rl_data.energon.task_encoders.chat_sft import ChatSFTTaskEncoder
from rl_data.energon.task_encoders.cookers import COOKERS, ChatCooker, ChatSample, get_cooker
from rl_data.energon.task_encoders.preference import PreferenceCooker, PreferenceTaskEncoder
from rl_data.energon.multimodal.task_encoders.vlm_sft import MultimodalChatCooker, VLMSFTTaskEncoder

COOKERS.update({"multimodal_chat": MultimodalChatCooker, "preference": PreferenceCooker})

#: Task encoder classes by name (``EnergonLoaderConfig`` selects one).
TASK_ENCODERS: dict[str, type[BaseSFTTaskEncoder]] = {
    "chat_sft": ChatSFTTaskEncoder,
    "vlm_sft": VLMSFTTaskEncoder,
    "preference": PreferenceTaskEncoder,
}


def get_task_encoder_class(name: str) -> type[BaseSFTTaskEncoder]:
    """The task encoder class registered as ``name``."""
    try:
        return TASK_ENCODERS[name]
    except KeyError:
        raise ValueError(
            f"unknown task encoder {name!r}; valid task encoders are {sorted(TASK_ENCODERS)}"
        ) from None


__all__ = [
    "COOKERS",
    "TASK_ENCODERS",
    "BaseSFTTaskEncoder",
    "ChatCooker",
    "ChatSFTTaskEncoder",
    "ChatSample",
    "EncodedSFTSample",
    "MultimodalChatCooker",
    "PackedSFTSample",
    "PreferenceCooker",
    "PreferenceTaskEncoder",
    "ProcessorAdapter",
    "VLMSFTTaskEncoder",
    "get_cooker",
    "get_task_encoder_class",
]
