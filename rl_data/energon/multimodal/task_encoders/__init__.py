"""Task encoders under the seed's ``rl_data.energon.multimodal.task_encoders`` path.

``base`` re-exports the SFT base; ``vlm_sft`` is the multimodal SFT encoder, ``processor`` the
offline multimodal processor and ``media`` the media decoding it uses.
"""

from rl_data.energon.multimodal.task_encoders.base import BaseSFTTaskEncoder
from rl_data.energon.multimodal.task_encoders.media import MediaSettings
from rl_data.energon.multimodal.task_encoders.processor import (
    MultimodalProcessor,
    build_multimodal_processor,
    load_default_multimodal_processor,
)
from rl_data.energon.multimodal.task_encoders.vlm_sft import (
    MultimodalChatCooker,
    MultimodalChatSample,
    VLMSFTTaskEncoder,
)

__all__ = [
    "BaseSFTTaskEncoder",
    "MediaSettings",
    "MultimodalChatCooker",
    "MultimodalChatSample",
    "MultimodalProcessor",
    "VLMSFTTaskEncoder",
    "build_multimodal_processor",
    "load_default_multimodal_processor",
]
