"""Task encoders under the seed's ``rl_data.energon.multimodal.task_encoders`` path."""

from rl_data.energon.multimodal.task_encoders.base import BaseSFTTaskEncoder

__all__ = ["BaseSFTTaskEncoder"]
