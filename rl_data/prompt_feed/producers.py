"""``RankProducer``: the prompts of one rank actor's loader as a :class:`~rl_data.prompt_feed.merge.Producer`.

The rank actor's loader reads its shard in exact passes (``source.epoch_mode="exact"``,
``virtual_epoch_length=0``) and ``RankActor.next_batch`` returns each batch with the loader state
right after it. A batch belongs to pass ``state_after["position"]["passes"]`` (the stream counts a
pass when its end is reached, which is before the next pass's first batch is produced), so the
first batch of a later pass tells that the current pass is over: :meth:`RankProducer.next_item`
then returns :data:`~rl_data.prompt_feed.merge.PASS_END` and keeps that batch for the next call.

Items are the batch rows: ``key`` is the row's ``source_ids`` entry, ``payload`` the row as a dict
(each column's row; tensors cloned, so a row does not pin its whole batch in memory).

State (cheap, no remote call): ``{"loader": <loader state before the current batch>,
"offset": <rows of it handed out>, "pass": <pass being handed out>}``. Restoring loads that
loader state into the rank actor (fresh, before its first batch), the next batch is the same
batch again, and the first ``offset`` rows are skipped. A rank actor that dies (or whose batch
object is lost) is replaced through the ``replace`` callback, and the replacement is restored to
the loader state before the batch the producer is waiting for: nothing is lost or repeated.

Calls are blocking (``ray.get``) and not thread-safe: call them from one thread at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rl_data.distributed.rank_pool import RankFailedError, RankTimeoutError
from rl_data.prompt_feed.merge import PASS_END, Item, PassEnd

#: The fields of a :class:`RankProducer` state.
STATE_KEYS = ("loader", "offset", "pass")


def batch_rows(batch: Any) -> list[Item]:
    """The rows of a ``DatumSpec`` batch as items keyed by ``source_ids`` (tensors cloned)."""
    import torch

    keys = batch.get("source_ids") if hasattr(batch, "get") else None
    if keys is None:
        found = sorted(batch) if hasattr(batch, "keys") else type(batch).__name__
        raise ValueError(
            f"a prompt batch needs a 'source_ids' column to key its prompts, found {found}; "
            "build the loader with the rl_prompt task (source ids are on by default)"
        )
    rows = []
    for index, key in enumerate(keys):
        row = {}
        for column, values in batch.items():
            value = values[index]
            row[column] = value.clone() if isinstance(value, torch.Tensor) else value
        rows.append(Item(str(key), row))
    return rows


def check_producer_state(rank: int, state: Any) -> None:
    """Refuse (``ValueError``) a producer state that is not ``{"loader", "offset", "pass"}`` with
    int offset and pass >= 0 (the loader state itself is the rank actor's to check)."""
    if not isinstance(state, dict) or set(state) != set(STATE_KEYS):
        found = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"rank {rank} producer state has keys {found}, expected {sorted(STATE_KEYS)}")
    if any(type(state[k]) is not int or state[k] < 0 for k in ("offset", "pass")):
        raise ValueError(
            f"rank {rank} producer state has offset {state['offset']!r} and pass {state['pass']!r}, "
            "expected ints >= 0; the checkpoint is damaged"
        )


def batch_pass(state_after: Any) -> int:
    """The exact pass a batch belongs to, from the loader state right after it."""
    position = state_after.get("position") if isinstance(state_after, dict) else None
    if not isinstance(position, dict) or type(position.get("passes")) is not int:
        raise ValueError(
            f"loader state position {position!r} has no pass count; the prompt feed needs a "
            "training loader in exact passes (source.epoch_mode='exact', split_role='train')"
        )
    return position["passes"]


class RankProducer:
    """The prompts of one rank actor in passes (see module doc)."""

    def __init__(
        self,
        rank: int,
        actor: Any,
        initial_state: dict[str, Any],
        *,
        replace: Callable[[int, BaseException], Any],
        batch_timeout_s: float,
        control_timeout_s: float,
    ) -> None:
        """``initial_state``: the actor's loader state before its first batch; ``replace(rank,
        cause)`` kills the dead actor and returns a fresh one in its place (nothing restored)."""
        self.rank, self.actor = rank, actor
        self._replace = replace
        self._batch_timeout_s, self._control_timeout_s = batch_timeout_s, control_timeout_s
        self._base = initial_state  # loader state before the current batch
        self._offset = 0  # rows of the current batch handed out
        self._pass = batch_pass(initial_state)
        self._rows: list[Item] | None = None  # the current batch, once fetched
        self._after: Any = None  # loader state after the current batch, once fetched
        self._rows_pass = 0  # the pass of the current batch, once fetched
        self._call: Any = None  # the outstanding next_batch call (kept across a timeout)
        self.batches_fetched = 0

    def state(self) -> dict[str, Any]:
        return {"loader": self._base, "offset": self._offset, "pass": self._pass}

    def restore(self, state: Any) -> None:
        """Load ``state["loader"]`` into the rank actor (which must not have started yet)."""
        check_producer_state(self.rank, state)
        self._load(state["loader"])
        self._base, self._offset, self._pass = state["loader"], state["offset"], state["pass"]
        self._rows = self._after = self._call = None

    def next_item(self) -> Item | PassEnd:
        while True:
            if self._rows is None:
                batch, after = self._fetch()
                self._rows, self._after, self._rows_pass = batch_rows(batch), after, batch_pass(after)
                if self._offset > len(self._rows):
                    raise ValueError(
                        f"rank {self.rank}: the restored offset {self._offset} is past the {len(self._rows)} "
                        "rows of the batch it points into; the loader is not deterministic or the "
                        "checkpoint belongs to other data"
                    )
            if self._rows_pass > self._pass:
                self._pass = self._rows_pass
                return PASS_END
            if self._offset < len(self._rows):
                self._offset += 1
                return self._rows[self._offset - 1]
            self._base, self._offset, self._rows = self._after, 0, None

    def _fetch(self) -> tuple[Any, Any]:
        """The actor's next batch (the one after ``self._base``) and the state after it."""
        import ray
        from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError, RayTaskError

        while True:
            if self._call is None:
                self._call = self.actor.next_batch.remote()
            batch_ref, state_ref = self._call
            try:
                after = ray.get(state_ref, timeout=self._batch_timeout_s)
                batch = ray.get(batch_ref, timeout=self._batch_timeout_s)
            except GetTimeoutError:
                raise RankTimeoutError(
                    f"rank {self.rank} delivered no batch within {self._batch_timeout_s:g} s; raise "
                    "RuntimeConfig.step_timeout_s if it is only slow, otherwise inspect that actor"
                ) from None
            except (RayActorError, ObjectLostError) as error:
                self._call = None
                self.actor = self._replace(self.rank, error)
                self._load(self._base)
                continue
            except RayTaskError as error:
                self._call = None
                raise RankFailedError(f"rank {self.rank} failed producing a batch: {error.cause!r}") from None
            self._call = None
            self.batches_fetched += 1
            return batch, after

    def _load(self, loader_state: Any) -> None:
        """Load ``loader_state`` into the actor, replacing it (and loading again) if it died."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        while True:
            try:
                ray.get(self.actor.load_state_dict.remote(loader_state), timeout=self._control_timeout_s)
                return
            except GetTimeoutError:
                raise RankTimeoutError(
                    f"rank {self.rank} did not restore its loader state within {self._control_timeout_s:g} s; "
                    "raise RuntimeConfig.control_timeout_s if it is only slow"
                ) from None
            except RayActorError as error:
                self.actor = self._replace(self.rank, error)
            except RayTaskError as error:
                raise RankFailedError(f"rank {self.rank} failed restoring its loader state: {error.cause!r}") from None
