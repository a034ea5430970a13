"""``ChatSFTTaskEncoder``: text chat conversations -> tokenised SFT samples."""

from __future__ import annotations

from megatron.energon import stateless

from rl_data.energon.task_encoders.base import BaseSFTTaskEncoder, EncodedSFTSample
from rl_data.energon.task_encoders.cookers import ChatSample


class ChatSFTTaskEncoder(BaseSFTTaskEncoder):
    """Formats a :class:`ChatSample`'s messages (and tools) through the adapter's chat template."""

    COMPONENT_VERSION = 1

    @stateless
    def encode_sample(self, sample: ChatSample) -> EncodedSFTSample:
        """Tokenise one conversation; raises ``ValueError`` for malformed messages."""
        return self.encode_conversation(sample, sample.messages, sample.tools)
