"""Re-export of :class:`rl_data.energon.task_encoders.base.BaseSFTTaskEncoder` at the seed's path."""

from rl_data.energon.task_encoders.base import BaseSFTTaskEncoder

__all__ = ["BaseSFTTaskEncoder"]
