"""Async-RL prompt feed: exactly once per prompt while prompts finish out of order (internal;
users import ``start_prompt_feed``, ``FeedConfig`` and ``attach_feed`` from :mod:`rl_data`).

:class:`~rl_data.prompt_feed.ledger.PromptLedger` is the pure bookkeeping (no Ray, no I/O) over producers merged by
:class:`~rl_data.prompt_feed.merge.MergedStream`; see :mod:`rl_data.prompt_feed.ledger` for the semantics.
"""

from rl_data._moved import moved_names as _moved_names

# Former re-exports (see rl_data/_moved.py).
__getattr__ = _moved_names(
    __name__,
    {
        "Cursor": "rl_data.prompt_feed.merge",
        "EpochCounts": "rl_data.prompt_feed.epoch_book",
        "Item": "rl_data.prompt_feed.merge",
        "MergedStream": "rl_data.prompt_feed.merge",
        "PASS_END": "rl_data.prompt_feed.merge",
        "PassEnd": "rl_data.prompt_feed.merge",
        "Producer": "rl_data.prompt_feed.merge",
        "PromptLedger": "rl_data.prompt_feed.ledger",
        "Pull": "rl_data.prompt_feed.merge",
        "TakenPrompt": "rl_data",
        "Uid": "rl_data.prompt_feed.merge",
        "UidStateError": "rl_data",
    },
)
