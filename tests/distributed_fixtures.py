"""Helpers for the distributed runtime tests: specs, a reference stream, running coordinators.

The reference stream is read from the same loaders in the test process (no Ray), so every
runtime test compares the sample ids it consumed with what an uninterrupted loader yields.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from rl_data.distributed.client import wait_until_name_is_free
from rl_data.distributed.config import LoaderSpec, ParallelLayout, RuntimeConfig
from rl_data.distributed.placement import config_layout, placement_fingerprint

#: Every ray.get in these tests waits at most this long.
TIMEOUT_S = 60.0
#: Energon loader worker processes the exactly-once and kill tests run with.
ENERGON_WORKERS = (0, 2)
#: The same for the slowest kill tests: their 0-worker runs (the path every other coordinator test
#: takes) only with --run-slow, which keeps the default suite near 15 min; CI runs both.
ENERGON_WORKERS_0_SLOW = (pytest.param(0, marks=pytest.mark.slow), 2)


def train_spec(dataset: Any, workers: int = 0, **overrides: Any) -> LoaderSpec:
    """Train split, shuffled, 2 conversations per batch, virtual epochs of 5 batches; ``workers`` Energon workers."""
    energon = {"shuffle_buffer_size": 20, "max_samples_per_sequence": 10, "num_workers": workers}
    args: dict[str, Any] = dict(
        data_config={"energon": energon, "shuffle": True},
        source={"path": dataset.path, "split": "train", "virtual_epoch_length": 5},
        batch_size=2,
        max_sequence_length=256,
    )
    args.update(overrides)
    return LoaderSpec(**args)


def runtime_config(world_size: int, prefetch_depth: int, **overrides: Any) -> RuntimeConfig:
    """Small bundles (0.25 CPU per rank) in a test-only namespace."""
    args: dict[str, Any] = dict(
        parallel_layout=ParallelLayout(dp=world_size),
        prefetch_depth=prefetch_depth,
        bundle_resources={"CPU": 0.25},
        rank_actor_num_cpus=0.25,
        namespace="rl_data_tests",
        name="test_coordinator",
        step_timeout_s=TIMEOUT_S,
        control_timeout_s=TIMEOUT_S,
    )
    args.update(overrides)
    return RuntimeConfig(**args)


def reference_stream(spec: LoaderSpec, config: RuntimeConfig, tokenizer: Any, steps: int) -> list[list[list[str]]]:
    """``[step][rank] -> source ids`` of an uninterrupted run, read directly from the loaders."""
    return _direct_run(spec, config, tokenizer, steps, lambda loader, batch: list(batch["source_ids"]))


def reference_batches(spec: LoaderSpec, config: RuntimeConfig, tokenizer: Any, steps: int) -> list[list[Any]]:
    """``[step][rank] -> batch`` of an uninterrupted run, read directly from the loaders."""
    return _direct_run(spec, config, tokenizer, steps, lambda loader, batch: batch)


def reference_batches_and_states(
    spec: LoaderSpec, config: RuntimeConfig, processor: Any, steps: int
) -> tuple[list[list[Any]], list[list[dict[str, Any]]]]:
    """``[step][rank] -> batch`` and ``[step][rank] -> loader.state_dict()`` after that step's batch
    (what a rank actor hands out with it), from one direct read of the loaders."""
    both = _direct_run(spec, config, processor, steps, lambda loader, batch: (batch, loader.state_dict()))
    return [[batch for batch, _ in step] for step in both], [[state for _, state in step] for step in both]


def origin_checkpoint(spec: LoaderSpec, config: RuntimeConfig, tokenizer: Any, like: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint a coordinator of ``config`` over ``spec`` starts from (its ``origin_state_dict()``)
    without starting one: ``like`` (a checkpoint of a coordinator of ``config``: envelope, step 0,
    placement, consumer layout) holding every rank's initial loader state, built here as its rank actor
    builds it (the same states, tensor for tensor)."""
    from rl_data.distributed.rank_actor import loader_builder

    build, fingerprint, ranks = loader_builder(spec), placement_fingerprint(config_layout(config)), []
    for rank in range(config.world_size):
        loader = build(spec, tokenizer, logical_rank=rank, logical_world_size=config.world_size,
                       placement_fingerprint=fingerprint)  # fmt: skip
        ranks.append(loader.state_dict())
        loader.close()
    assert like["step"] == 0, f"like is the checkpoint of step {like['step']}, expected a step-0 one"
    return {**like, "ranks": ranks}


def _direct_run(spec: LoaderSpec, config: RuntimeConfig, tokenizer: Any, steps: int, take: Any) -> list[list[Any]]:
    """``[step][rank] -> take(loader, batch)`` of an uninterrupted run of each rank's loader."""
    from rl_data.energon.sft_dataloader import build_energon_sft_loader

    fingerprint = placement_fingerprint(config_layout(config))
    per_rank = []
    for rank in range(config.world_size):
        loader = build_energon_sft_loader(
            **spec.builder_kwargs(),
            processor=tokenizer,
            logical_rank=rank,
            logical_world_size=config.world_size,
            placement_fingerprint=fingerprint,
        )
        taken, iterator = [], iter(loader)
        while len(taken) < steps:
            try:
                taken.append(take(loader, next(iterator)))
            except StopIteration:  # end of a virtual epoch: the stream continues
                iterator = iter(loader)
        loader.close()
        per_rank.append(taken)
    return [[per_rank[r][s] for r in range(config.world_size)] for s in range(steps)]


def merged_by_dp(reference: list[list[list[str]]], dp: int) -> list[list[list[str]]]:
    """``[step][dp rank] -> source ids`` of a per-shard reference, merged as the coordinator merges."""
    from rl_data.distributed.shard_map import shard_assignment

    return [
        [[i for s in shards for i in step[s]] for shards in shard_assignment(len(step), dp)]
        for step in reference
    ]


@contextlib.contextmanager
def running_coordinator(ray: Any, config: RuntimeConfig, spec: LoaderSpec, **kwargs: Any) -> Iterator[Any]:
    """A started coordinator that is shut down and killed (with its rank actors) afterwards."""
    from rl_data.distributed.coordinator import start_data_coordinator

    handle = start_data_coordinator(config, spec, **kwargs)
    try:
        yield handle
    finally:
        shut_down(ray, handle, config.name, config.namespace)


class SharedCoordinator:
    """A running coordinator that the tests of one module share (a module fixture) where their subject
    is a live coordinator of its configuration: one start (~2 CPU-s, and ~3 CPU-s per Energon rank
    actor) instead of one per test.

    :meth:`reset`, at each test's start, rewinds it to :attr:`initial`, the checkpoint it started
    from: step 0 committed and handed out, nothing pending, every rank at its start. What it counted
    before goes on (``rewinds``, ``restarts``): a test compares those with their value at its start.
    Its origin (``origin_state_dict``) is not reset; a test of the origin starts its own coordinator.
    A coordinator that does not come back (a failed test left a restore in flight) is replaced.
    """

    def __init__(self, ray: Any, config: RuntimeConfig, spec: LoaderSpec) -> None:
        self.ray, self.config, self.spec = ray, config, spec
        self._start()

    def _start(self) -> None:
        from rl_data.distributed.coordinator import start_data_coordinator

        self.handle = start_data_coordinator(self.config, self.spec)
        self.initial = self.ray.get(self.handle.origin_state_dict.remote(), timeout=TIMEOUT_S)

    def reset(self) -> Any:
        """The coordinator's handle, restored to :attr:`initial` (after steps: a rewind; right after
        another restore: new loaders, as a loader restores once)."""
        try:
            self.ray.get(self.handle.load_state_dict.remote(self.initial), timeout=TIMEOUT_S)
        except Exception:  # noqa: BLE001 - whatever a failed test left: a new coordinator
            self.close()
            self._start()
        return self.handle

    def close(self) -> None:
        shut_down(self.ray, self.handle, self.config.name, self.config.namespace)


def shared_train_coordinator(ray: Any, dataset: Any, name: str) -> Iterator[SharedCoordinator]:
    """The body of a module fixture: a :class:`SharedCoordinator` of 2 ranks, prefetch depth 1, over
    ``train_spec(dataset)``, for the tests whose subject is a live coordinator of that configuration."""
    shared = SharedCoordinator(ray, runtime_config(2, 1, name=name), train_spec(dataset))
    try:
        yield shared
    finally:
        shared.close()


def shut_down(ray: Any, handle: Any, name: str, namespace: str) -> None:
    """Shut a named coordinator or feed down (its rank actors, its placement group), kill it and
    wait until its name is free."""
    with contextlib.suppress(Exception):
        ray.get(handle.shutdown.remote(), timeout=TIMEOUT_S)
    ray.kill(handle, no_restart=True)
    wait_until_name_is_free(name, namespace, TIMEOUT_S)


def ids_of(ray: Any, refs: list[Any]) -> list[list[str]]:
    """``[rank] -> source ids`` of one step's batch refs."""
    return [list(batch["source_ids"]) for batch in ray.get(refs, timeout=TIMEOUT_S)]


def wait_for(predicate: Any, what: str, timeout: float = TIMEOUT_S) -> Any:
    """Poll ``predicate`` until it returns a true value; fail naming ``what`` after ``timeout``."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def consume(ray: Any, coordinator: Any, steps: int, *, commit: bool = True) -> list[list[list[str]]]:
    """Take ``steps`` steps (committing each); return ``[step][rank] -> source ids``."""
    consumed = []
    for _ in range(steps):
        step, refs = ray.get(coordinator.next_step.remote(), timeout=TIMEOUT_S)
        consumed.append([list(batch["source_ids"]) for batch in ray.get(refs, timeout=TIMEOUT_S)])
        if commit:
            ray.get(coordinator.commit.remote(step), timeout=TIMEOUT_S)
    return consumed


def synthetic_reference_stream(spec: LoaderSpec, config: RuntimeConfig, steps: int) -> list[list[list[str]]]:
    """``[step][rank] -> source ids`` of an uninterrupted run of a synthetic task's loaders
    (``rl_data.tasks.synthetic``: no tokenizer, no Energon), read directly; passes continued as a rank actor does."""
    from rl_data.distributed.rank_actor import loader_builder
    from rl_data.tasks.synthetic import load_stub_tokenizer

    fingerprint = placement_fingerprint(config_layout(config))
    per_rank = []
    for rank in range(config.world_size):
        loader = loader_builder(spec)(
            spec, load_stub_tokenizer(), logical_rank=rank, logical_world_size=config.world_size,
            placement_fingerprint=fingerprint,
        )  # fmt: skip
        batches: list[list[str]] = []
        while len(batches) < steps:  # one pass per loop
            batches += [list(batch["source_ids"]) for batch in loader]
        per_rank.append(batches[:steps])
    return [[per_rank[r][s] for r in range(config.world_size)] for s in range(steps)]


#: ``cached_reference_stream``'s reads: (spec, world size, placement) -> ``[step][rank] -> source ids``.
_REFERENCE_STREAMS: dict[tuple[str, int, str], list[list[list[str]]]] = {}


def cached_reference_stream(
    spec: LoaderSpec, config: RuntimeConfig, tokenizer: Any, steps: int, *, read_at_least: int = 6
) -> list[list[list[str]]]:
    """:func:`reference_stream`, read once per test process for each loader spec and placement (the
    stream depends on nothing else): the first read takes ``max(steps, read_at_least)`` steps, a
    longer request reads again from the start."""
    key = (spec.model_dump_json(), config.world_size, placement_fingerprint(config_layout(config)))
    known = _REFERENCE_STREAMS.get(key)
    if known is None or len(known) < steps:
        known = _REFERENCE_STREAMS[key] = reference_stream(spec, config, tokenizer, max(steps, read_at_least))
    return known[:steps]


def reference_stream_and_states(
    spec: LoaderSpec, config: RuntimeConfig, tokenizer: Any, steps: int
) -> tuple[list[list[list[str]]], list[list[dict[str, Any]]]]:
    """:func:`reference_batches_and_states` with each batch's source ids (``[step][rank] -> ids``)."""
    batches, states = reference_batches_and_states(spec, config, tokenizer, steps)
    return [[list(batch["source_ids"]) for batch in step] for step in batches], states
