"""``StepPrefetcher``: the trainer's side of a coordinator, with the next step already in hand.

    with StepPrefetcher(coordinator, transform=to_training_tensors) as steps:
        for step, batches in steps:        # step k is trained while k+1 is fetched
            train(batches)
            if step % 100 == 0:
                steps.commit_trained()      # every step returned so far is trained: commit
                save_checkpoint(...)        # then coordinator.save_checkpoint / state_dict

One background thread asks the coordinator for the next step, fetches its batches and applies
``transform`` (padding, pinning, ...), so the trainer's ``next()`` waits only when data is
slower than training. Contract: asking for step k+1 means step k is trained. The thread then
commits it in the same round trip as its request (``next_step(commit=k)``), so committed
steps are always trained ones; :meth:`commit_trained` commits up to the last returned step
exactly, for a checkpoint.

Every request names the step it expects (``next_step(expected_step=k)``), so nothing is
skipped: batches that cannot be fetched any more (their node died) are asked for again
(``redeliver``, same contents, fresh refs), and :meth:`close` reports the first step not
returned to the trainer (``on_close``), from which a ``CoordinatorClient`` continues.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Optional

import ray
from ray.exceptions import ObjectLostError

_POLL_S = 0.5
#: Times the batches of one step are asked for again when they cannot be fetched.
_REDELIVERIES = 3


class StepPrefetcher:
    """Iterates ``(step, payload)``; payload: ``transform(batches)`` (fetched) or the refs (``fetch=False``)."""

    def __init__(
        self,
        coordinator: Any,
        *,
        transform: Optional[Callable[[list[Any]], Any]] = None,
        fetch: bool = True,
        timeout_s: float = 600.0,
        start_step: Optional[int] = None,
        on_close: Optional[Callable[[int], None]] = None,
    ) -> None:
        """``start_step``: the first step to ask for (default: the first uncommitted one).
        ``on_close(step)``: called once by :meth:`close` with the first step not returned."""
        self._coordinator, self._transform, self._fetch = coordinator, transform, fetch
        self._timeout = timeout_s
        self._start, self._on_close = start_step, on_close
        self._request: Optional[int] = start_step  # the step the thread asks for next
        self._ready: queue.Queue = queue.Queue(maxsize=1)
        self._lock = threading.Lock()  # orders the thread's piggybacked commits and commit_trained
        self._returned = self._trained = self._committed = 0
        self._in_flight: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rl_data-step-prefetcher", daemon=True)
        self._thread.start()

    def __iter__(self) -> "StepPrefetcher":
        return self

    def __next__(self) -> tuple[int, Any]:
        """The next step; the step returned before counts as trained from now on."""
        if self._stop.is_set():
            raise StopIteration
        self._trained = self._returned
        try:
            item = self._ready.get(timeout=self._timeout)
        except queue.Empty:
            raise TimeoutError(f"no training step arrived within {self._timeout:g} s (after step {self._returned})") from None
        if isinstance(item, BaseException):
            self.close()
            raise item
        self._returned = item[0]
        return item

    def commit_trained(self) -> int:
        """Commit every step returned so far (call once the last one is trained); return it."""
        with self._lock:
            if self._in_flight is not None:  # its piggybacked commit must land first
                ray.wait([self._in_flight], timeout=self._timeout)
            if self._returned > self._committed:
                ray.get(self._coordinator.commit.remote(self._returned), timeout=self._timeout)
                self._committed = self._returned
            self._trained = self._returned
            return self._committed

    def close(self) -> None:
        """Stop prefetching; steps fetched but not returned are neither committed nor lost.

        ``on_close`` learns the first step not returned, which a consumer asks for next.
        """
        if self._stop.is_set():
            return
        self._stop.set()
        while not self._ready.empty():
            self._ready.get_nowait()
        first_unreturned = self._returned + 1 if self._returned else self._start
        if self._on_close is not None and first_unreturned is not None:
            self._on_close(first_unreturned)

    def __enter__(self) -> "StepPrefetcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item: Any = self._next_step()
            except BaseException as error:  # raised by the trainer's next __next__
                item = error
            while not self._stop.is_set():
                try:
                    self._ready.put(item, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return

    def _next_step(self) -> tuple[int, Any]:
        if self._request is None:
            self._request = self._start = self._get(self._coordinator.progress.remote())["committed_step"] + 1
        with self._lock:
            commit = self._trained if self._trained > self._committed else None
            self._in_flight = self._coordinator.next_step.remote(commit=commit, expected_step=self._request)
            self._committed = max(self._committed, commit or 0)
        step, refs = self._get(self._in_flight)
        self._request = step + 1
        if not self._fetch:
            return step, refs
        batches = self._fetch_batches(step, refs)
        return step, batches if self._transform is None else self._transform(batches)

    def _fetch_batches(self, step: int, refs: list[Any]) -> list[Any]:
        redelivered = 0
        while True:
            try:
                return self._get(list(refs))
            except ObjectLostError:  # the batches' node died: the coordinator re-produces them
                redelivered += 1
                if redelivered > _REDELIVERIES:
                    raise
                refs = self._get(self._coordinator.redeliver.remote(step))

    def _get(self, refs: Any) -> Any:
        return ray.get(refs, timeout=self._timeout)
