"""Energon rank state <-> bytes that decode without running code.

``SavableDataLoader.save_state_rank()`` returns Energon dataclasses holding ``FlexState``
dicts, lists, tuples, bytes, numpy arrays and tensors (random generator states). Pickling them
would let a crafted checkpoint run any code on load, so the state is written as UTF-8 JSON
instead: plain values stay plain, every other value is a JSON object tagged ``"$"`` with one of
:data:`TAGS` (an allow-list of exactly the types Energon 7.4 saves), and decoding builds only
those types. Anything else is refused with :class:`StateCodecError` naming its type and where
it is, on save as on load.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from contextvars import ContextVar
from typing import Any

import numpy
import torch
from megatron.energon.flavors.webdataset.sample_loader import SliceState
from megatron.energon.rng import SystemRngState
from megatron.energon.savable_loader import (
    SavableDataLoaderState,
    SavableDatasetCheckpoint,
    SavableDatasetState,
)
from megatron.energon.state import FlexState

#: Written first, so a payload saved by another codec (or an old pickle) is recognised.
CODEC = "rl_data.energon_state/1"
_PICKLE_MARK = 0x80  # first byte of every pickle of protocol >= 2
_DATACLASSES = {
    cls.__name__: cls
    for cls in (
        SavableDataLoaderState,
        SavableDatasetCheckpoint,
        SavableDatasetState,
        SystemRngState,
        SliceState,
    )
}
_DATACLASS_FIELDS = {
    name: tuple(f.name for f in dataclasses.fields(cls)) for name, cls in _DATACLASSES.items()
}
_TENSOR_DTYPES = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
    )
}
_ARRAY_KINDS = "biuf"  # bool, signed, unsigned, float: numpy arrays of plain numbers only
_PLAIN = (str, int, float, bool, type(None))
#: Every tag a decoder accepts, with the keys its object has besides ``"$"``.
_TAG_KEYS = {
    "FlexState": ("items",),
    "dict": ("items",),
    "tuple": ("items",),
    "bytes": ("b64",),
    "tensor": ("dtype", "shape", "b64"),
    "ndarray": ("dtype", "shape", "b64"),
    **{name: ("fields",) for name in _DATACLASSES},
}
TAGS = tuple(_TAG_KEYS)


class StateCodecError(ValueError):
    """A rank state holds a type outside the allow-list, or a payload is not a valid encoding."""


class DeferredValue:
    """A state value that only makes a restore faster and is costly to make: a state saves
    :meth:`resolve`'s value, or ``None`` when :func:`encode_rank_state` is asked to leave it out.
    Pickling saves the resolved value (what an Energon worker sends is always complete)."""

    __slots__ = ()

    def resolve(self) -> Any:
        """The value to save (allow-listed types only)."""
        raise NotImplementedError

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return _resolved, (self.resolve(),)

    def __deepcopy__(self, memo: dict[int, Any]) -> DeferredValue:
        return self  # a snapshot that never changes


def _resolved(value: Any) -> Any:
    return value


#: While :func:`encode_rank_state` leaves deferred values out: the list it collects them in.
_LEFT_OUT: ContextVar[list[DeferredValue] | None] = ContextVar("rl_data_state_left_out", default=None)


class EncodedValueCache:
    """JSON of state values that their owner never changes, encoded once each.

    With Energon workers a rank state holds one checkpoint per worker, and after a batch only
    the worker that made it has a new one: :func:`encode_rank_state` reuses the others' JSON
    (2 workers, packed: ~0.5 MB of JSON per state). Values are kept by identity, and held, so
    an identity cannot be reused while its JSON is here.
    """

    def __init__(self) -> None:
        self._values: dict[int, tuple[Any, str | None]] = {}

    def add(self, value: Any) -> None:
        """``value`` will not change from now on (encoded when a state first holds it)."""
        self._values.setdefault(id(value), (value, None))

    def discard(self, value: Any) -> None:
        """``value`` is in no later state: forget it."""
        self._values.pop(id(value), None)

    def clear(self) -> None:
        """Forget every value (the loader restored another state)."""
        self._values.clear()

    def __len__(self) -> int:
        return len(self._values)

    def json_of(self, value: Any, where: Any) -> str | None:
        """The JSON of an added ``value`` (None for a value never added)."""
        entry = self._values.get(id(value))
        if entry is None:
            return None
        if entry[1] is None:
            reset = _LEFT_OUT.set(None)  # cached JSON is always complete
            try:
                entry = (value, _dumps(_encode(value, where)))
            finally:
                _LEFT_OUT.reset(reset)
            self._values[id(value)] = entry
        return entry[1]


def encode_rank_state(
    state: Any, cache: EncodedValueCache | None = None, *, left_out: list[DeferredValue] | None = None
) -> bytes:
    """``state`` (what ``save_state_rank()`` returned, None included) as UTF-8 JSON bytes.

    ``cache``: worker checkpoint states it holds are not encoded again (same bytes).
    ``left_out``: save ``None`` for every :class:`DeferredValue` instead of resolving it, and
    append it to this list.
    """
    reset = _LEFT_OUT.set(left_out)
    try:
        if cache and type(state) is SavableDataLoaderState:
            spliced = _encode_with_cached_worker_states(state, cache)
            if spliced is not None:
                return spliced.encode("utf-8")
        return _dumps({"codec": CODEC, "state": _encode(state, "state")}).encode("utf-8")
    finally:
        _LEFT_OUT.reset(reset)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _encode_with_cached_worker_states(state: SavableDataLoaderState, cache: EncodedValueCache) -> str | None:
    """The document with each cached worker state's JSON put in place of a marker string, or
    None when a marker is not found exactly once in the rest (a state string equal to it). The
    cached JSON is joined in one pass, never searched."""
    checkpoints, cached = [], {}
    for index, checkpoint in enumerate(state.worker_states):
        if type(checkpoint) is SavableDatasetCheckpoint:
            where = ((("state", ("worker_states",)), index), ("state",))
            json_text = cache.json_of(checkpoint.state, where)
            if json_text is not None:
                marker = f"\x00rl_data worker state {index}"
                cached[_dumps(marker)] = json_text
                checkpoint = dataclasses.replace(checkpoint, state=marker)
        checkpoints.append(checkpoint)
    skeleton = dataclasses.replace(state, worker_states=checkpoints)
    text = _dumps({"codec": CODEC, "state": _encode(skeleton, "state")})
    spans = []
    for marker, json_text in cached.items():
        if text.count(marker) != 1:
            return None
        spans.append((text.index(marker), len(marker), json_text))
    pieces, start = [], 0
    for at, length, json_text in sorted(spans):
        pieces += (text[start:at], json_text)
        start = at + length
    pieces.append(text[start:])
    return "".join(pieces)


def decode_rank_state(data: bytes) -> Any:
    """The rank state :func:`encode_rank_state` encoded (a ``SavableDataLoaderState`` or None);
    builds only the allow-listed types."""
    if data[:1] == bytes([_PICKLE_MARK]):
        raise StateCodecError(
            "the Energon rank state is a pickle: it was saved by an older rl_data and cannot be "
            "loaded safely (unpickling can run any code); restart from the beginning of the data "
            "or from a checkpoint saved by this rl_data version"
        )
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise StateCodecError(
            f"the Energon rank state is not valid {CODEC} JSON ({error}); the checkpoint is "
            "damaged, restore from another checkpoint"
        ) from None
    if not isinstance(document, dict) or document.get("codec") != CODEC or set(document) != {
        "codec",
        "state",
    }:
        found = sorted(document) if isinstance(document, dict) else type(document).__name__
        raise StateCodecError(
            f"the Energon rank state is not a {CODEC} document (found {_short(found)}, expected "
            f"keys ['codec', 'state'] with codec {CODEC!r}); it was saved by another rl_data "
            "version or is damaged"
        )
    try:
        state = _decode(document["state"], "state")
    except RecursionError:
        raise _invalid("state", "nested deeper than Python can decode") from None
    if state is not None and type(state) is not SavableDataLoaderState:  # Energon: a bare AssertionError
        expected = "expected a SavableDataLoaderState or null (the initial state)"
        raise _invalid("state", f"a {type(state).__name__}, {expected}")
    return state


def _encode(value: Any, where: Any) -> Any:
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is list or kind is tuple:
        items = [v if type(v) in _PLAIN else _encode(v, (where, i)) for i, v in enumerate(value)]
        return items if kind is list else {"$": "tuple", "items": items}
    if kind is FlexState or kind is dict:
        return {"$": kind.__name__, "items": _encode_items(value, where)}
    if kind is bytes:
        return {"$": "bytes", "b64": _b64(value)}
    if kind is torch.Tensor:
        return _encode_tensor(value, where)
    if kind is numpy.ndarray and value.dtype.kind in _ARRAY_KINDS:
        raw = numpy.ascontiguousarray(value).tobytes()
        shape = list(value.shape)
        return {"$": "ndarray", "dtype": value.dtype.str, "shape": shape, "b64": _b64(raw)}
    name = kind.__name__
    if _DATACLASSES.get(name) is kind:
        fields = {f: _encode(getattr(value, f), (where, (f,))) for f in _DATACLASS_FIELDS[name]}
        return {"$": name, "fields": fields}
    if isinstance(value, DeferredValue):
        left_out = _LEFT_OUT.get()
        if left_out is None:
            return _encode(value.resolve(), where)
        left_out.append(value)
        return None
    raise StateCodecError(
        f"cannot save the Energon rank state: {_path(where)} is a "
        f"{kind.__module__}.{kind.__qualname__}{_dtype_note(value)}, which is not in the "
        f"allow-list of state types (plain JSON values, lists, {', '.join(TAGS)}); a checkpoint "
        "holds data only. If an Energon upgrade or a new dataset wrapper saves this type, add it "
        "to rl_data.energon.state_codec"
    )


def _encode_items(mapping: dict, where: Any) -> dict[str, Any]:
    items = {}
    for key, item in mapping.items():
        if type(key) is not str:
            raise StateCodecError(
                f"cannot save the Energon rank state: {_path(where)} has the key {key!r} of type "
                f"{type(key).__name__}; state mappings may have str keys only"
            )
        items[key] = item if type(item) in _PLAIN else _encode(item, (where, key))
    return items


def _path(where: Any) -> str:
    """Render a path kept as nested ``(parent, step)`` pairs, a step being an index, a key or
    ``(field,)``: built only for an error, as saving runs after every batch."""
    steps = []
    while isinstance(where, tuple):
        where, step = where
        steps.append(f".{step[0]}" if type(step) is tuple else f"[{step!r}]")
    return where + "".join(reversed(steps))


def _encode_tensor(tensor: torch.Tensor, where: Any) -> dict[str, Any]:
    dtype = str(tensor.dtype).removeprefix("torch.")
    if dtype not in _TENSOR_DTYPES:
        raise StateCodecError(
            f"cannot save the Energon rank state: {_path(where)} is a tensor of dtype {dtype}; "
            f"allowed dtypes are {', '.join(_TENSOR_DTYPES)}"
        )
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return {"$": "tensor", "dtype": dtype, "shape": list(tensor.shape), "b64": _b64(raw)}


def _decode(value: Any, where: Any) -> Any:
    if type(value) is list:
        return [v if type(v) in _PLAIN else _decode(v, (where, i)) for i, v in enumerate(value)]
    if type(value) is not dict:
        return value  # json gives only dicts, lists and plain values
    tag = value.get("$")
    keys = _TAG_KEYS.get(tag) if type(tag) is str else None
    if keys is None:
        raise _invalid(where, f"an object tagged {_short(tag)}, expected one of {', '.join(TAGS)}")
    if set(value) != {"$", *keys}:
        expected = sorted({"$", *keys})
        raise _invalid(where, f"a {tag} with keys {_short(sorted(value))}, expected {expected}")
    if tag == "tuple":
        return tuple(_decode(_typed(value, "items", list, where), where))
    if tag in ("FlexState", "dict"):
        items = _typed(value, "items", dict, where)
        decoded = {k: v if type(v) in _PLAIN else _decode(v, (where, k)) for k, v in items.items()}
        return FlexState(decoded) if tag == "FlexState" else decoded
    if tag == "bytes":
        return _unb64(value, where)
    if tag == "tensor":
        return _decode_tensor(value, where)
    if tag == "ndarray":
        return _decode_array(value, where)
    fields = _typed(value, "fields", dict, where)
    expected = _DATACLASS_FIELDS[tag]
    if set(fields) != set(expected):
        raise _invalid(where, f"a {tag} with fields {sorted(fields)}, expected {sorted(expected)}")
    return _DATACLASSES[tag](**{f: _decode(fields[f], (where, (f,))) for f in expected})


def _decode_tensor(value: dict, where: Any) -> torch.Tensor:
    dtype = _TENSOR_DTYPES.get(_typed(value, "dtype", str, where))
    if dtype is None:
        raise _invalid(where, f"a tensor of dtype {_short(value['dtype'])}")
    shape = _shape(value, where)
    raw = _unb64(value, where)
    if len(raw) != _count(shape) * dtype.itemsize:
        raise _invalid(where, f"a tensor of shape {shape} with {len(raw)} bytes")
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)


def _decode_array(value: dict, where: Any) -> numpy.ndarray:
    try:
        dtype = numpy.dtype(_typed(value, "dtype", str, where))
    except (TypeError, ValueError, SyntaxError):
        dtype = None
    if dtype is None or dtype.kind not in _ARRAY_KINDS or dtype.fields or dtype.subdtype:
        raise _invalid(where, f"an array of dtype {_short(value['dtype'])}, expected plain numbers")
    shape = _shape(value, where)
    raw = _unb64(value, where)
    if len(raw) != _count(shape) * dtype.itemsize:
        raise _invalid(where, f"an array of shape {shape} with {len(raw)} bytes")
    return numpy.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def _typed(value: dict, key: str, kind: type, where: Any) -> Any:
    if type(value[key]) is not kind:
        found = f"a {value['$']} whose {key!r} is a {type(value[key]).__name__}"
        raise _invalid(where, f"{found}, expected {kind.__name__}")
    return value[key]


def _shape(value: dict, where: Any) -> list[int]:
    shape = _typed(value, "shape", list, where)
    if not all(type(n) is int and n >= 0 for n in shape):
        raise _invalid(where, f"a {value['$']} of shape {_short(shape)}")
    return shape


def _unb64(value: dict, where: Any) -> bytes:
    try:
        return base64.b64decode(_typed(value, "b64", str, where), validate=True)
    except ValueError:
        raise _invalid(where, f"a {value['$']} with invalid base64 data") from None


def _count(shape: list[int]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _dtype_note(value: Any) -> str:
    dtype = getattr(value, "dtype", None)
    return f" of dtype {dtype}" if dtype is not None else ""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _invalid(where: Any, found: str) -> StateCodecError:
    return StateCodecError(
        f"the Energon rank state is damaged or was not written by rl_data: {_path(where)} is "
        f"{found}; restore from another checkpoint"
    )
