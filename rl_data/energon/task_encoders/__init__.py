"""Energon task encoders and cookers for rl_data, selectable by name."""

from __future__ import annotations

from rl_data.energon.task_encoders.adapter import ProcessorAdapter
from rl_data.energon.task_encoders.base import BaseSFTTaskEncoder, EncodedSFTSample, PackedSFTSample
from rl_data.energon.task_encoders.chat_sft import ChatSFTTaskEncoder
from rl_data.energon.task_encoders.cookers import COOKERS, ChatCooker, ChatSample, get_cooker

#: Task encoder classes by name (``EnergonLoaderConfig`` selects one).
TASK_ENCODERS: dict[str, type[BaseSFTTaskEncoder]] = {"chat_sft": ChatSFTTaskEncoder}


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
    "PackedSFTSample",
    "ProcessorAdapter",
    "get_cooker",
    "get_task_encoder_class",
]
