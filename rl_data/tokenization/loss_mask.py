"""Token-level loss masks on message logs (NeMo-RL's ``add_loss_mask_to_message_log``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rl_data.interfaces import LLMMessageLogType


def add_loss_mask_to_message_log(
    message_logs: Sequence[LLMMessageLogType],
    roles_to_train_on: Sequence[str] = ("assistant",),
    only_unmask_final: bool = False,
) -> None:
    """Set ``token_loss_mask`` (same shape and dtype as ``token_ids``) on every message, in place.

    A message's tokens are 1 (trained) when its role is in ``roles_to_train_on``
    (case-insensitive), else 0. With ``only_unmask_final`` only the last message of each log
    is 1, whatever its role.
    """
    trained_roles = {role.lower() for role in roles_to_train_on}
    for message_log in message_logs:
        last = len(message_log) - 1
        for index, message in enumerate(message_log):
            trained = index == last if only_unmask_final else message["role"] in trained_roles
            fill = torch.ones_like if trained else torch.zeros_like
            message["token_loss_mask"] = fill(message["token_ids"])
