"""Find a running data coordinator from another driver or an RL training loop.

    from rl_data.distributed.client import attach

    feed = attach("rl_data_coordinator", namespace="rl_data", address="auto")
    step, refs = feed.next_step()           # one batch ref per logical rank
    batch = feed.fetch(refs[dp_rank])       # or hand refs[r] to training actor r
    ...                                     # train on step `step`
    feed.commit(step)                       # the checkpoint now includes this step

or, with the next step fetched while the current one trains (commits piggybacked on requests):

    with feed.prefetched_steps() as steps:
        for step, batches in steps:         # one BatchedDataDict per logical rank
            ...                             # train; asking for the next step marks this one trained
            steps.commit_trained()          # before a checkpoint

``get_coordinator`` returns the raw actor handle; :func:`attach` also connects the driver and
wraps the handle in a :class:`CoordinatorClient` whose calls wait with a timeout.

No step is skipped: the client asks for the step it expects (``next_step(expected_step=k)``),
the first uncommitted step when it starts, then the step after the last one received. A call
that timed out and is repeated gets the same step (re-delivered), and after leaving
``prefetched_steps()`` early, ``next_step()`` returns the first step the loop did not return.
A consumer whose refs cannot be fetched any more (their node died) asks
``redeliver(step)`` for fresh refs with the same batches; ``pending_steps()`` lists the
steps handed out and not committed.

Several consumers of one step (DP workers that each train their part of every step): each
holds its own client, asks for the same step, ``next_step(expected_step=k)``, and fetches its
own ref, ``refs[dp_rank]``; the first request produces step k, the others get it re-delivered.
Exactly one of them (DP rank 0) commits k, and only once every worker has its batch of k (after
a collective every worker reaches, e.g. the gradient all-reduce or ``ray.train.report``):
a committed step is no longer handed out. ``rl_data.integrations.ray_train`` does this for
Ray Train workers.

A coordinator is rewound with ``load_checkpoint``/``load_state_dict`` on a live coordinator
(see ``DataCoordinator.load_state_dict``); clients that asked for steps before the rewind are
refused the steps past the checkpoint's: ask for ``load_state_dict``'s returned step + 1.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Optional

from rl_data.distributed.config import DEFAULT_NAME, DEFAULT_NAMESPACE

if TYPE_CHECKING:
    from rl_data.distributed.step_prefetcher import StepPrefetcher


class CoordinatorNotFoundError(LookupError):
    """No coordinator actor with the given name lives in the given namespace."""


def get_coordinator(name: str = DEFAULT_NAME, namespace: str = DEFAULT_NAMESPACE) -> Any:
    """The handle of the named ``DataCoordinator`` (the driver must already be connected to Ray).

    Every call on the handle returns an ObjectRef; ``ray.get`` it with a timeout.
    """
    import ray

    if not ray.is_initialized():
        raise RuntimeError(
            "not connected to Ray: call ray.init(address=..., namespace=...) with the cluster "
            "address before get_coordinator, or use attach(name, namespace, address)"
        )
    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        raise CoordinatorNotFoundError(
            f"no data coordinator named {name!r} in Ray namespace {namespace!r}; start one with "
            "rl_data.start_data_coordinator (RuntimeConfig.name/namespace must "
            "match) and check that its job is still running"
        ) from None


def wait_until_name_is_free(name: str, namespace: str, timeout_s: float) -> None:
    """Wait until no actor is registered as ``name`` in ``namespace`` (``ray.kill`` is asynchronous).

    Call it after killing a coordinator before starting another one of the same name.
    """
    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=namespace)
        except ValueError:
            return
        time.sleep(0.05)
    raise TimeoutError(f"actor name {name!r} in namespace {namespace!r} is still taken {timeout_s:g} s after the kill")


class CoordinatorClient:
    """Blocking, timed calls on a running ``DataCoordinator`` (see :meth:`DataCoordinator.next_step`)."""

    def __init__(self, handle: Any, *, timeout_s: float = 600.0) -> None:
        self.handle, self.timeout_s = handle, timeout_s
        self._expected: Optional[int] = None  # the step the next next_step() asks for

    def next_step(self, expected_step: Optional[int] = None, *, commit: Optional[int] = None) -> tuple[int, list[Any]]:
        """``(step, refs)``: one batch ObjectRef per DP rank of ``expected_step``, by default the
        step after the last one received (the first call: the first uncommitted step).

        A pending step (handed out, not committed) is re-delivered, the next new one produced;
        a committed step or one past the next is refused (``ValueError`` naming the pending
        steps). After a timeout, calling again returns the same step, never the one after.
        ``commit``: first commit that step (one round trip per step for a single consumer).
        """
        want = self.expected_step() if expected_step is None else expected_step
        step, refs = self._get(self.handle.next_step.remote(commit=commit, expected_step=want))
        self._expected = step + 1
        return step, refs

    def expected_step(self) -> int:
        """The step the next :meth:`next_step` returns."""
        if self._expected is None:
            self._expected = self._get(self.handle.progress.remote())["committed_step"] + 1
        return self._expected

    def redeliver_from(self, step: int) -> None:
        """Make the next :meth:`next_step` return ``step`` (pending steps are re-delivered)."""
        self._expected = step

    def redeliver(self, step: int) -> list[Any]:
        """Fresh refs of a pending step (handed out, not committed), e.g. after fetching one failed."""
        return self._get(self.handle.redeliver.remote(step))

    def pending_steps(self) -> list[int]:
        """The steps handed out and not yet committed, in order."""
        progress = self._get(self.handle.progress.remote())
        return list(range(progress["committed_step"] + 1, progress["handed_step"] + 1))

    def fetch(self, ref: Any, device: Any = None, *, writable: bool = False) -> Any:
        """The batch behind ``ref`` as a ``BatchedDataDict`` on ``device`` (default: CUDA if present)."""
        from rl_data.distributed.transfer import fetch_batch

        return fetch_batch(ref, device, timeout=self.timeout_s, writable=writable)

    def commit(self, step: int) -> None:
        """Mark every step up to ``step`` consumed (call after the training step finished)."""
        self._get(self.handle.commit.remote(step))
        self._expected = max(self._expected or 0, step + 1)

    def prefetched_steps(self, *, transform: Any = None, fetch: bool = True) -> "StepPrefetcher":
        """A :class:`~rl_data.distributed.step_prefetcher.StepPrefetcher` from :meth:`expected_step` on.

        When it closes, this client's next :meth:`next_step` returns the first step the
        prefetcher did not return to the trainer.
        """
        from rl_data.distributed.step_prefetcher import StepPrefetcher

        return StepPrefetcher(
            self.handle, transform=transform, fetch=fetch, timeout_s=self.timeout_s,
            start_step=self.expected_step(), on_close=self.redeliver_from,
        )

    def status(self) -> dict[str, Any]:
        """Handed-out and committed steps, restarts and what every rank is doing."""
        return self._get(self.handle.status.remote())

    def state_dict(self, step: Optional[int] = None) -> dict[str, Any]:
        """The checkpoint of the last committed step, or of pending ``step`` (store it with the
        model checkpoint of that step)."""
        return self._get(self.handle.state_dict.remote(step))

    def save_checkpoint(self, directory: str) -> str:
        """Write the checkpoint of the last committed step to ``directory`` (on the coordinator's node)."""
        return self._get(self.handle.save_checkpoint.remote(directory))

    def load_checkpoint(self, directory: str, *, reweight: bool = False) -> int:
        """Restore a checkpoint written by ``save_checkpoint`` (on the coordinator's node) into the
        coordinator, fresh or live (a rewind, see ``DataCoordinator.load_state_dict``); return its
        step. ``reweight``: a mixture with changed weights continues with them. The next
        :meth:`next_step` returns the step after it."""
        step = self._get(self.handle.load_checkpoint.remote(directory, reweight))
        self._expected = step + 1
        return step

    def load_state_dict(self, state: dict[str, Any], *, reweight: bool = False) -> int:
        """Restore a checkpoint dict (e.g. read from a training framework's checkpoint), fresh or
        live (a rewind), as :meth:`load_checkpoint` does; return its step."""
        self._get(self.handle.load_state_dict.remote(state, reweight))
        self._expected = int(state["step"]) + 1
        return self._expected - 1

    def origin_state_dict(self) -> dict[str, Any]:
        """The checkpoint the coordinator started from (see ``DataCoordinator.origin_state_dict``)."""
        return self._get(self.handle.origin_state_dict.remote())

    def progress(self) -> dict[str, int]:
        """``committed_step``, ``handed_step``, ``origin_step`` and ``rewinds`` (answers at once)."""
        return self._get(self.handle.progress.remote())

    def _get(self, ref: Any) -> Any:
        import ray

        return ray.get(ref, timeout=self.timeout_s)


def attach(
    name: str = DEFAULT_NAME,
    namespace: str = DEFAULT_NAMESPACE,
    address: Optional[str] = None,
    *,
    timeout_s: float = 600.0,
) -> CoordinatorClient:
    """Connect to Ray if needed and return a client of the coordinator ``name`` in ``namespace``.

    ``address`` is a GCS address (``host:6379``) or ``"auto"``; default ``$RAY_ADDRESS`` or
    ``"auto"`` (the cluster this machine belongs to). A driver that is already connected keeps
    its connection. Raises :class:`CoordinatorNotFoundError` when no such coordinator runs.
    """
    connect_driver(address, namespace, f"coordinator {name!r}")
    return CoordinatorClient(get_coordinator(name, namespace), timeout_s=timeout_s)


def connect_driver(address: Optional[str], namespace: str, attaching_to: str) -> None:
    """Connect this process to Ray unless it is: ``address``, else ``$RAY_ADDRESS``, else ``"auto"``.

    A failure names the address and ``attaching_to`` (what the caller wanted to reach).
    """
    import ray

    if ray.is_initialized():
        return
    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    try:
        ray.init(address=target, namespace=namespace)
    except ConnectionError as error:
        raise ConnectionError(
            f"cannot connect to a Ray cluster at {target!r} to attach to {attaching_to}: "
            f"{error}; pass the address of the cluster that runs the job (its head's host:6379)"
        ) from None
