"""Blocking, timed clients of a running :class:`~rl_data.prompt_feed.feed.PromptFeed`.

    from rl_data.prompt_feed.client import attach_feed

    rollout, trainer = attach_feed(namespace="rl_data", address="auto", holder="worker-3")  # DEFAULT_FEED_NAME
    prompts = rollout.take(8, wait_s=5.0)      # TakenPrompt(uid, key, payload = one DatumSpec row)
    ...                                        # generate; on failure: rollout.release([p.uid])
    trainer.ack([p.uid for p in trained])      # or trainer.drop(uids, "uniform_reward")
    trainer.save_checkpoint("/ckpt/step_100/data")
    trainer.load_checkpoint("/ckpt/step_100/data")   # on resume: a fresh feed, or this live one (a rewind)

``attach_feed`` and ``get_feed`` look for :data:`DEFAULT_FEED_NAME` unless given a name: where
``start_prompt_feed`` registers a feed whose ``RuntimeConfig.name`` was left at its default.

Every call waits at most ``timeout_s`` (``take`` also its ``wait_s``) and raises
``ray.exceptions.GetTimeoutError`` past it. A ``take`` that timed out on the client side may
still have handed out prompts (they stay outstanding, see :mod:`rl_data.prompt_feed.feed`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence

from rl_data.distributed.client import connect_driver
from rl_data.distributed.config import DEFAULT_NAMESPACE

#: The actor name of a prompt feed started with ``RuntimeConfig.name`` left at its default.
DEFAULT_FEED_NAME = "rl_data_prompt_feed"


class FeedNotFoundError(LookupError):
    """No prompt feed actor with the given name lives in the given namespace."""


class _FeedCalls:
    def __init__(self, handle: Any, *, timeout_s: float = 600.0) -> None:
        self.handle, self.timeout_s = handle, timeout_s

    def ack(self, uids: Sequence[Any], outcomes: Optional[Sequence[Any]] = None) -> None:
        """Outstanding prompts were trained; ``outcomes``: an ``Outcome`` (or None) per uid, for the schedule."""
        self._get(self.handle.ack.remote(list(uids), None if outcomes is None else list(outcomes)))

    def drop(self, uids: Sequence[Any], reason: str, outcomes: Optional[Sequence[Any]] = None) -> None:
        """Outstanding prompts were consumed without training (e.g. ``"uniform_reward"``); ``outcomes`` as in :meth:`ack`."""
        self._get(self.handle.drop.remote(list(uids), reason, None if outcomes is None else list(outcomes)))

    def release(self, uids: Sequence[Any]) -> None:
        """Give outstanding prompts back (generation failed, worker preempted): handed out again first."""
        self._get(self.handle.release.remote(list(uids)))

    def status(self) -> dict[str, Any]:
        """The feed's counters, window and ranks (see ``PromptFeed.status``)."""
        return self._get(self.handle.status.remote())

    def _get(self, ref: Any, extra_s: float = 0.0) -> Any:
        import ray

        return ray.get(ref, timeout=self.timeout_s + extra_s)


class RolloutClient(_FeedCalls):
    """What a rollout worker calls: take prompts, give back the ones it could not finish.

    ``holder`` (e.g. the worker's actor name) is recorded with every prompt it takes, so a
    supervisor can release them all with :meth:`TrainerClient.release_holder` if it dies.
    """

    def __init__(self, handle: Any, *, timeout_s: float = 600.0, holder: Optional[str] = None) -> None:
        super().__init__(handle, timeout_s=timeout_s)
        self.holder = holder

    def take(self, n: int, wait_s: Optional[float] = None) -> list[Any]:
        """Up to ``n`` prompts; waits up to ``wait_s`` (feed default if None) for room in the window."""
        return self._get(self.handle.take.remote(n, wait_s, self.holder), extra_s=wait_s or 0.0)


class TrainerClient(_FeedCalls):
    """What the trainer calls: resolve prompts and checkpoint the feed with the model."""

    def release_holder(self, holder: str, keep: Sequence[Any] = ()) -> list[Any]:
        """Release every outstanding prompt ``holder`` took (a dead or preempted worker) except the
        ones in ``keep`` (their results already reached you: they stay outstanding, held by nobody,
        until you ack, drop or release them); return the released uids."""
        return self._get(self.handle.release_holder.remote(holder, list(keep)))

    def set_member_weights(self, weights: dict[str, float], at: Optional[Sequence[int]] = None) -> list[int]:
        """New mixture weights (member name -> weight, relative, as in the mixture), from uid ``at``
        (default: the next prompt the feed reaches) on; returns that uid (see ``PromptFeed.set_member_weights``)."""
        return self._get(self.handle.set_member_weights.remote(dict(weights), None if at is None else list(at)))

    def save_checkpoint(self, directory: str) -> str:
        """Write the feed's checkpoint to ``directory`` (on the feed's node); return the file."""
        return self._get(self.handle.save_checkpoint.remote(directory))

    def load_checkpoint(self, directory: str) -> dict[str, Any]:
        """Restore the feed from ``directory`` (on the feed's node); return the ledger summary.

        Into a fresh feed, or a live one (a rewind, e.g. when the trainer resumes after a crash):
        every prompt outstanding or prefetched is forgotten and the checkpoint's unresolved
        prompts are handed out again; acks of uids handed out before it raise ``UidStateError``
        until they are handed out again. A refused checkpoint (another dataset, layout or
        format: ``ValueError`` with the differences) changes nothing; a second restore while
        one is in flight raises ``RuntimeError``.
        """
        return self._get(self.handle.load_checkpoint.remote(directory))

    def state_dict(self) -> dict[str, Any]:
        """The feed's checkpoint as data (write it where the trainer's checkpoint lives)."""
        return self._get(self.handle.state_dict.remote())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint returned by :meth:`state_dict` (see :meth:`load_checkpoint`)."""
        self._get(self.handle.load_state_dict.remote(state))


class FeedClients(NamedTuple):
    rollout: RolloutClient
    trainer: TrainerClient


def get_feed(name: str = DEFAULT_FEED_NAME, namespace: str = DEFAULT_NAMESPACE) -> Any:
    """The handle of the named feed (the driver must be connected to Ray)."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError(
            "not connected to Ray: call ray.init(address=..., namespace=...) before get_feed, or use attach_feed"
        )
    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        raise FeedNotFoundError(
            f"no prompt feed named {name!r} in Ray namespace {namespace!r}; start one with "
            "rl_data.start_prompt_feed (RuntimeConfig.name/namespace must match; a "
            f"name left at its default registers as {DEFAULT_FEED_NAME!r}) and check that its job is still running"
        ) from None


def attach_feed(
    name: str = DEFAULT_FEED_NAME,
    namespace: str = DEFAULT_NAMESPACE,
    address: Optional[str] = None,
    *,
    timeout_s: float = 600.0,
    holder: Optional[str] = None,
) -> FeedClients:
    """Connect to Ray if needed (``address``, else ``$RAY_ADDRESS``, else ``"auto"``) and return
    a rollout client (taking as ``holder``) and a trainer client of the feed ``name`` in ``namespace``."""
    connect_driver(address, namespace, f"prompt feed {name!r}")
    handle = get_feed(name, namespace)
    return FeedClients(RolloutClient(handle, timeout_s=timeout_s, holder=holder), TrainerClient(handle, timeout_s=timeout_s))
