"""Rank states with Energon workers, without asking the workers.

Energon 7.4 answers ``save_state_rank()`` with workers by sending ``get_checkpoint`` to every
worker and waiting for all answers; a worker answers only between two items, so each save waits
until every worker has finished the batch it is making (~60 ms per state on 2 cores, where the
rank saves one after every batch). Here each worker sends its newest checkpoint along with the
item it yields (it stores one before every yield, see ``checkpoint_every_sec``), and the loader's
process answers from its copy with Energon's own rule: per worker the newest checkpoint at or
before the next sample index, plus the samples to skip from it. Before a worker's first item the
answer is the state it was restored from (or the initial state), as
``SavableDatasetWrapper.get_initial_checkpoint`` gives it.

Only loaders passed to :func:`ship_checkpoints` send checkpoints (their workers run
:meth:`rl_data.energon.compat.SavableDatasetWrapper.items_with_checkpoints`); their items then
arrive as :class:`WithCheckpoint` and :class:`WorkerCheckpoints` takes them apart. The item inside
travels as :mod:`rl_data.energon.worker_items` pickles it (small tensors inside the message).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from megatron.energon.savable_loader import SavableDataLoaderState, SavableDatasetCheckpoint
from torch.utils.data._utils.pin_memory import pin_memory

from rl_data.energon.compat import SavableDatasetWrapper, SavableLoader, internals
from rl_data.energon.state_codec import EncodedValueCache
from rl_data.energon.worker_items import dumps_item, loads_item


class WithCheckpoint:
    """An item from a worker, with the worker checkpoint stored before it was yielded
    (``(sample_index, state)``), or None when that checkpoint was sent before."""

    __slots__ = ("item", "checkpoint")

    def __init__(self, item: Any, checkpoint: tuple[int, Any] | None) -> None:
        self.item, self.checkpoint = item, checkpoint

    def __reduce__(self) -> tuple[Any, ...]:
        return _from_worker, (dumps_item(self.item), self.checkpoint)

    def pin_memory(self, device: Any = None) -> "WithCheckpoint":
        """Pinned like the bare item would be (torch's DataLoader with ``pin_memory=True``)."""
        return WithCheckpoint(pin_memory(self.item, device), self.checkpoint)


def _from_worker(item: bytes, checkpoint: tuple[int, Any] | None) -> WithCheckpoint:
    return WithCheckpoint(loads_item(item), checkpoint)


def ship_checkpoints(loader: SavableLoader) -> None:
    """Make ``loader``'s workers send their checkpoints with their items (before its workers
    start, i.e. before the first ``iter()``)."""
    if not isinstance(loader.dataset, SavableDatasetWrapper):
        raise TypeError(
            f"ship_checkpoints found a loader whose workers run {type(loader.dataset).__qualname__}, expected "
            "a rl_data.energon.compat.SavableLoader with worker processes; build it so (num_workers > 0)"
        )
    loader.dataset.envelope = WithCheckpoint


class WorkerCheckpoints:
    """The loader process's copy of each worker's checkpoints since the start or restore.

    The checkpoints that arrived from the workers are this process's own copies, never changed:
    ``encoded`` keeps their JSON for the states that hold them again.
    """

    def __init__(self, loader: SavableLoader) -> None:
        self._loader = loader
        self._per_worker: list[deque[tuple[int, Any]]] = []
        self.encoded = EncodedValueCache()
        self.reset()

    def reset(self) -> None:
        """Start from the state the loader restores (or the initial state): call after
        ``restore_state_rank``."""
        self._per_worker = [
            deque([(0 if state is None else state.sample_index, state)])
            for state in internals.pending_restores(self._loader)
        ]
        self.encoded.clear()

    def take(self, worker: int, shipped: Any) -> Any:
        """The bare item of ``shipped`` (a :class:`WithCheckpoint` of ``worker``), keeping its
        checkpoint."""
        if not isinstance(shipped, WithCheckpoint):
            raise TypeError(
                f"worker {worker} sent {type(shipped).__name__}, expected WithCheckpoint: the "
                "loader's workers were started before ship_checkpoints"
            )
        if shipped.checkpoint is not None:
            self._per_worker[worker].append(shipped.checkpoint)
            self.encoded.add(shipped.checkpoint[1])
        return shipped.item

    def delivered(self, worker: int, sample_index: int) -> None:
        """``worker``'s item ``sample_index`` was delivered: older checkpoints are not needed."""
        entries = self._per_worker[worker]
        while len(entries) > 1 and entries[1][0] <= sample_index + 1:
            self.encoded.discard(entries.popleft()[1])

    def save_state_rank_at(self, counters: list[int], next_worker: int) -> SavableDataLoaderState:
        """The rank state after each worker's item ``counters[w]`` (Energon's ``save_state_rank``
        at those counters, answered here)."""
        return SavableDataLoaderState(
            worker_states=[self._checkpoint(w, counter) for w, counter in enumerate(counters)],
            next_worker_id=next_worker,
            micro_batch_size=internals.micro_batch_size(self._loader),
        )

    def _checkpoint(self, worker: int, counter: int) -> SavableDatasetCheckpoint:
        wanted = counter + 1  # the next sample index of this worker
        for sample_index, state in reversed(self._per_worker[worker]):
            if sample_index <= wanted:
                return SavableDatasetCheckpoint(state=state, offset=wanted - sample_index)
        raise RuntimeError(
            f"no checkpoint of worker {worker} at or before sample {wanted} (have "
            f"{[index for index, _ in self._per_worker[worker]]}); this is a bug in rl_data"
        )

