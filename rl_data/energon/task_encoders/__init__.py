"""Energon task encoders and cookers of the built-in tasks (registered in :mod:`rl_data.tasks`)."""

from __future__ import annotations

from rl_data.energon.task_encoders.adapter import ProcessorAdapter
from rl_data.energon.task_encoders.base import BaseSFTTaskEncoder, EncodedSFTSample, PackedSFTSample
from rl_data.energon.task_encoders.chat_sft import ChatSFTTaskEncoder
from rl_data.energon.task_encoders.cookers import ChatCooker, ChatSample
from rl_data.energon.task_encoders.preference import PreferenceCooker, PreferenceTaskEncoder

__all__ = [
    "BaseSFTTaskEncoder",
    "ChatCooker",
    "ChatSFTTaskEncoder",
    "ChatSample",
    "EncodedSFTSample",
    "PackedSFTSample",
    "PreferenceCooker",
    "PreferenceTaskEncoder",
    "ProcessorAdapter",
]
