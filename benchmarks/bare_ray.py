"""Bare-Ray contenders for ``benchmarks/scale.py``: the least Ray work each rl_data call pattern needs.

* :class:`BareCoordinator` over :class:`BareRank` actors: per step, one ``next_batch`` call per rank
  (two caller-owned returns: the batch and the state after it) and one batched wait for the states,
  the pending steps' refs kept until committed. That is the coordinator's hand-out with everything of
  rl_data's taken out (step book, recovery, metrics, DP merge, checks); the ranks return one synthetic
  batch and state made once, of the same size as the real ones.
* :class:`BareFeed`: ``take(n)`` returns n prompts (``TakenPrompt`` with the same payload size),
  ``ack`` does nothing: the prompt feed's calls without its ledger, lock or producers.

Each runs under the same load and measurement as the real one, so ``rl_data / bare`` is rl_data's own
share of the cost and the bare figure is the floor of this machine's Ray for that call pattern.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from array import array
from typing import Any, Optional


class BareRank:
    """Returns the same batch and state on every call (made once from the synthetic loader)."""

    def __init__(self, batch: Any, state: dict[str, Any]) -> None:
        self.batch, self.state = batch, state

    async def next_batch(self) -> tuple[Any, dict[str, Any]]:
        return self.batch, self.state


class BareCoordinator:
    """``next_step(commit)``: one call per rank, one batched wait for their states, refs kept until committed."""

    def __init__(self, ranks: list[Any]) -> None:
        self.ranks = ranks
        self.pending: dict[int, tuple[list[Any], list[Any]]] = {}
        self.step = 0

    def pid(self) -> int:
        return os.getpid()

    async def next_step(self, commit: Optional[int] = None) -> tuple[int, list[Any]]:
        import ray

        for done in [step for step in self.pending if commit is not None and step <= commit]:
            del self.pending[done]
        calls = [rank.next_batch.options(num_returns=2).remote() for rank in self.ranks]
        state_refs = [state for _, state in calls]
        states = await asyncio.get_running_loop().run_in_executor(None, lambda: ray.get(state_refs))
        self.step += 1
        self.pending[self.step] = ([batch for batch, _ in calls], states)
        return self.step, self.pending[self.step][0]


class BareFeed:
    """``take(n)``: n prompts of ``prompt_tokens`` int32 ids with fresh uids; ``ack``: nothing."""

    def __init__(self, prompt_tokens: int) -> None:
        self.payload = {"token_ids": array("i", range(prompt_tokens))}
        self.uids = itertools.count()

    async def take(self, n: int) -> list[Any]:
        from rl_data.prompt_feed.ledger import TakenPrompt
        from rl_data.prompt_feed.merge import Uid

        return [TakenPrompt(Uid(0, next(self.uids)), "bare", self.payload) for _ in range(n)]

    async def ack(self, uids: list[Any]) -> None:
        return None

    async def shutdown(self) -> None:
        return None
