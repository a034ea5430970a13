"""Over-long samples: keep a few tokens per message and drop the sample from the loss.

This is NeMo-RL's SFT preprocessing rule: a sample whose length reaches ``max_seq_length`` is
not split or cut at the end (which would train on a partial answer); every message keeps only
its first ``min(4, max_seq_length // n_messages)`` tokens and the sample's ``loss_multiplier``
becomes 0, so it still occupies a batch slot but contributes nothing to the loss.
"""

from __future__ import annotations

import torch

from rl_data.interfaces import LLMMessageLogType

# Per-message tensors aligned with ``token_ids`` that are cut together with it.
TOKEN_ALIGNED_KEYS = ("token_ids", "token_loss_mask")
MAX_TOKENS_KEPT_PER_MESSAGE = 4


def message_log_length(message_log: LLMMessageLogType) -> int:
    """Total number of tokens over all messages."""
    return sum(len(message["token_ids"]) for message in message_log)


def truncate_message_log(
    message_log: LLMMessageLogType, max_seq_length: int
) -> tuple[LLMMessageLogType, int, float]:
    """Return ``(message_log, length, loss_multiplier)`` after the over-length rule.

    When ``length >= max_seq_length``: a new log whose messages keep their first
    ``min(4, max_seq_length // len(message_log))`` entries of ``token_ids`` and
    ``token_loss_mask``, its recomputed length, and 0.0. Otherwise the same log, its length
    and 1.0. The input log is never modified.
    """
    if max_seq_length <= 0:
        raise ValueError(f"max_seq_length must be a positive number of tokens, got {max_seq_length}")
    length = message_log_length(message_log)
    if length < max_seq_length:
        return message_log, length, 1.0
    keep = min(MAX_TOKENS_KEPT_PER_MESSAGE, max_seq_length // len(message_log))
    truncated = [_cut_message(message, keep) for message in message_log]
    return truncated, message_log_length(truncated), 0.0


def _cut_message(message: dict, keep: int) -> dict:
    cut = dict(message)
    for key in TOKEN_ALIGNED_KEYS:
        value = message.get(key)
        if isinstance(value, torch.Tensor):
            cut[key] = value[:keep]
    return cut
