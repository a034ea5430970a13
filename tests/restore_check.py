"""Reusable check: restore a stateful loader after every step and compare the rest.

Works with anything that has ``__iter__`` (yielding batches, possibly in epochs that end),
``state_dict()`` and ``load_state_dict(state)``: the Energon loader, a rank actor wrapped in
a small adapter, the coordinator. Batches are pulled as one stream across epochs: when an
iterator ends, ``iter()`` is called again (two empty epochs in a row end the stream).

:func:`assert_restores_at_every_step`:

1. runs ``steps`` batches uninterrupted (the reference);
2. runs again, saving the state after every batch (k = 0 .. steps - 1), and checks that saving
   did not change the batches;
3. for every k builds a fresh loader, restores the state saved after k batches (round-tripped
   through ``torch.save`` / ``torch.load(weights_only=True)``), pulls the remaining
   ``steps - k`` batches and asserts they equal the reference: same sample ids in the same
   order (none missing, none duplicated) and equal tensors.

:func:`assert_rewinds_at_every_step` is the same oracle for the step-based runtime (the
coordinator, the prompt feed): it drives one live component through ``take`` / ``save`` /
``restore`` callables and rewinds it to the state after every step.
:func:`assert_resumes_from_every_state` is its second half, for states saved by another
component (a coordinator at another DP size) with the expected steps of this one.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

#: Extracts ``(sample ids, {name: tensor})`` from one batch.
Extract = Callable[[Any], tuple[Sequence[Any], Mapping[str, torch.Tensor]]]


@dataclass(frozen=True)
class Step:
    """What one batch held, and the epoch it came from."""

    ids: tuple[Any, ...]
    tensors: dict[str, torch.Tensor]
    epoch: int


@dataclass(frozen=True)
class RestoreReport:
    """The reference run: its steps and the k at which a new epoch started."""

    steps: list[Step]
    epoch_starts: list[int]

    @property
    def ids(self) -> list[Any]:
        return [i for step in self.steps for i in step.ids]


def stream(
    loader: Any, extract: Extract, steps: int, on_step: Callable[[int], None] | None = None
) -> list[Step]:
    """Pull ``steps`` batches across epochs; ``on_step(k)`` runs after k batches (k = 0 ..)."""
    result: list[Step] = []
    epoch, empty_epochs = 0, 0
    iterator: Iterator[Any] = iter(loader)
    if on_step is not None:
        on_step(0)
    while len(result) < steps:
        try:
            batch = next(iterator)
        except StopIteration:
            empty_epochs = 0 if result and result[-1].epoch == epoch else empty_epochs + 1
            if empty_epochs >= 2:
                break
            epoch += 1
            iterator = iter(loader)
            continue
        ids, tensors = extract(batch)
        result.append(Step(tuple(ids), {k: v.detach().clone() for k, v in tensors.items()}, epoch))
        if on_step is not None and len(result) < steps:
            on_step(len(result))
    return result


def torch_roundtrip(state: Any) -> Any:
    """``state`` after ``torch.save`` + ``torch.load(weights_only=True)``."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def assert_same_steps(expected: Sequence[Step], found: Sequence[Step], *, context: str) -> None:
    """Equal ids (order, no gaps, no duplicates) and equal tensors, step by step."""
    expected_ids = [i for s in expected for i in s.ids]
    found_ids = [i for s in found for i in s.ids]
    if found_ids != expected_ids:
        missing = [i for i in expected_ids if i not in set(found_ids)]
        extra = [i for i in found_ids if i not in set(expected_ids)]
        duplicated = sorted({i for i in found_ids if found_ids.count(i) > 1}, key=str)
        raise AssertionError(
            f"{context}: sample ids differ from the uninterrupted run: {len(found_ids)} ids "
            f"instead of {len(expected_ids)}, missing {missing[:10]}, unexpected {extra[:10]}, "
            f"duplicated {duplicated[:10]}; first steps expected {[s.ids for s in expected[:2]]}, "
            f"found {[s.ids for s in found[:2]]}"
        )
    assert len(found) == len(expected), f"{context}: {len(found)} batches, expected {len(expected)}"
    for index, (want, got) in enumerate(zip(expected, found, strict=True)):
        assert want.ids == got.ids, f"{context}: batch {index} ids {got.ids} != {want.ids}"
        assert set(want.tensors) == set(got.tensors), (
            f"{context}: batch {index} tensors {sorted(got.tensors)} != {sorted(want.tensors)}"
        )
        for name, tensor in want.tensors.items():
            assert torch.equal(tensor, got.tensors[name]), (
                f"{context}: batch {index} tensor {name!r} differs from the uninterrupted run"
            )


def assert_restores_at_every_step(
    make_loader: Callable[[], Any],
    *,
    steps: int,
    extract: Extract,
    close: Callable[[Any], None] | None = None,
    save: Callable[[Any], Any] = lambda loader: loader.state_dict(),
) -> RestoreReport:
    """Restore after every k in ``0 .. steps - 1`` and compare the rest (see module doc).

    ``close(loader)`` runs when a loader is no longer needed (e.g. to stop its workers);
    ``save(loader)`` takes the state (default: ``state_dict()``).
    """

    def done(loader: Any) -> None:
        if close is not None:
            close(loader)

    loader = make_loader()
    reference = stream(loader, extract, steps)
    done(loader)
    assert len(reference) == steps, f"the loader gave only {len(reference)} of {steps} batches"

    saved: dict[int, Any] = {}
    loader = make_loader()
    with_saves = stream(
        loader, extract, steps, on_step=lambda k: saved.__setitem__(k, save(loader))
    )
    done(loader)
    assert_same_steps(reference, with_saves, context="run with a state_dict() after every batch")

    for k in range(steps):
        loader = make_loader()
        loader.load_state_dict(torch_roundtrip(saved[k]))
        rest = stream(loader, extract, steps - k)
        done(loader)
        assert_same_steps(reference[k:], rest, context=f"restored after {k} batches")

    epoch_starts = [k for k in range(1, steps) if reference[k].epoch != reference[k - 1].epoch]
    return RestoreReport(steps=reference, epoch_starts=epoch_starts)


def record_steps(take: Callable[[], Any], save: Callable[[], Any], steps: int) -> tuple[list[Any], list[Any]]:
    """Take ``steps`` steps (``take()``: one step's sample ids); return the ids of every step and
    the states before the first and after each (``save()``, round-tripped through ``torch.save`` /
    ``torch.load(weights_only=True)``): ``states[k]`` is the state after k steps."""
    states, taken = [torch_roundtrip(save())], []
    for _ in range(steps):
        taken.append(take())
        states.append(torch_roundtrip(save()))
    return taken, states


def assert_resumes_from_every_state(
    take: Callable[[], Any],
    restore: Callable[[Any], None],
    states: Sequence[Any],
    expected: Sequence[Any],
    *,
    before_restore: Callable[[], None] | None = None,
    down_to: int = 0,
) -> None:
    """For k = len(expected) - 1 .. ``down_to``, restore the live component to ``states[k]`` (the
    state after k of the ``expected`` steps, saved by this component or by another one, e.g. a
    coordinator at another DP size) and take the rest: every step's ids (``take()``) must equal
    ``expected[k:]``, in order, none missing, none repeated. ``before_restore`` runs before each
    restore (e.g. to leave a step pending)."""
    for k in range(len(expected) - 1, down_to - 1, -1):
        if before_restore is not None:
            before_restore()
        restore(states[k])
        rest = [take() for _ in range(len(expected) - k)]
        if rest != list(expected[k:]):
            want, found = _flat(expected[k:]), _flat(rest)
            missing = [i for i in want if i not in found]
            repeated = sorted({i for i in found if found.count(i) > 1}, key=repr)
            raise AssertionError(
                f"restored to the state after step {k}: {len(missing)} id(s) missing {missing[:5]!r}, "
                f"repeated {repeated[:5]!r}; first steps found {rest[:2]!r}, expected {list(expected[k:k + 2])!r}"
            )


def assert_rewinds_at_every_step(
    take: Callable[[], Sequence[Any]],
    save: Callable[[], Any],
    restore: Callable[[Any], None],
    steps: int,
    *,
    before_rewind: Callable[[], None] | None = None,
) -> list[Any]:
    """Take ``steps`` steps (``take()``: one step's sample ids) saving the state after each
    (``save()``), then rewind the live component to the state after every step and take the rest
    (:func:`assert_resumes_from_every_state`; ``before_rewind`` runs before each rewind). Returns
    the reference ``[step] -> ids``."""
    reference, states = record_steps(take, save, steps)
    assert_resumes_from_every_state(take, restore, states, reference, before_restore=before_rewind)
    return reference


def _flat(ids: Any) -> list[Any]:
    """The sample ids of nested lists (steps, ranks, packs), in order."""
    if isinstance(ids, (list, tuple)):
        return [i for item in ids for i in _flat(item)]
    return [ids]
