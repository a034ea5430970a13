"""Async-RL prompt feed: exactly once per prompt while prompts finish out of order.

:class:`PromptLedger` is the pure bookkeeping (no Ray, no I/O) over producers merged by
:class:`MergedStream`; see :mod:`rl_data.prompt_feed.ledger` for the semantics.
"""

from rl_data.prompt_feed.ledger import EpochCounts, PromptLedger, TakenPrompt, UidStateError
from rl_data.prompt_feed.merge import PASS_END, Cursor, Item, MergedStream, PassEnd, Producer, Pull, Uid

__all__ = [
    "PASS_END",
    "Cursor",
    "EpochCounts",
    "Item",
    "MergedStream",
    "PassEnd",
    "Producer",
    "PromptLedger",
    "Pull",
    "TakenPrompt",
    "Uid",
    "UidStateError",
]
