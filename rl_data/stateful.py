"""The one stateful contract: what a checkpoint of any rl_data part looks like and how it is checked.

Every stateful part (the loader, the rank actor, the coordinator, the prompt feed and its ledger)
has ``state_dict()`` and ``load_state_dict(state)``, and names its format in two class constants,
``STATE_FORMAT`` and ``STATE_VERSION``. A state is an *envelope*: a plain dict (str keys, lists,
numbers, strings, bytes, None, tensors; it loads with ``torch.load(weights_only=True)``) holding the
format under :data:`KEY_FORMAT`, its version under :data:`KEY_VERSION`, and the part's fields.
:func:`envelope` builds one, :func:`open_envelope` checks one (format, version, fields) and
refuses anything else with a ``ValueError`` saying what was found, what was expected and what to
do, before the part changes anything.

The Energon loader's state keeps the reference format (NeMo-RL's format 2: ``backend`` names the
format); its ``format_key`` is ``"backend"``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Protocol, runtime_checkable

KEY_FORMAT = "format"
KEY_VERSION = "format_version"


@runtime_checkable
class Stateful(Protocol):
    """A part whose position can be saved and restored exactly."""

    STATE_FORMAT: ClassVar[str]
    STATE_VERSION: ClassVar[int]

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def envelope(fmt: str, version: int, fields: Mapping[str, Any], *, format_key: str = KEY_FORMAT) -> dict[str, Any]:
    """A state of format ``fmt`` version ``version`` holding ``fields``."""
    clash = {format_key, KEY_VERSION} & set(fields)
    if clash:
        raise ValueError(f"state fields {sorted(clash)} would overwrite the envelope's own keys")
    return {format_key: fmt, KEY_VERSION: version, **fields}


def open_envelope(
    state: Any,
    *,
    fmt: str,
    version: int,
    what: str,
    fields: Iterable[str] | None = None,
    format_key: str = KEY_FORMAT,
) -> dict[str, Any]:
    """The fields of ``state`` after checking that it is ``fmt`` at ``version`` (and, when given,
    holds exactly ``fields``); a ``ValueError`` names what was found and the fix."""
    if not isinstance(state, Mapping):
        raise ValueError(f"not a {what} state: found a {type(state).__name__}, expected a dict with {format_key}={fmt!r}")
    if state.get(format_key) != fmt:
        raise ValueError(f"not a {what} state: in checkpoint: {format_key}={state.get(format_key)!r} / expected: {fmt!r}")
    if state.get(KEY_VERSION) != version:
        raise ValueError(
            f"{what} state format version: in checkpoint: {state.get(KEY_VERSION)!r} / this rl_data reads: {version}; "
            "restore it with the rl_data version that saved it"
        )
    content = {key: value for key, value in state.items() if key not in (format_key, KEY_VERSION)}
    if fields is not None:
        expected = set(fields)
        if set(content) != expected:
            missing, unknown = sorted(expected - set(content)), sorted(set(content) - expected, key=str)
            raise ValueError(
                f"{what} state is malformed: missing {missing}, unknown {unknown}; it was not written by this "
                "rl_data version's state_dict: restore from another checkpoint"
            )
    return content
