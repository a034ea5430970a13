"""Restore a packing loader's buffers from the saved state instead of re-encoding them.

Energon 7.4 saves the buffers of its ``PackingDataset`` (the reading buffer and the
pre-packed bins) as restore keys only: a restored loader re-reads every buffered sample and
re-runs cook and ``encode_sample`` (chat template and tokenisation) on it, ~128 encodes for a
buffer of 128 before the first batch. :class:`PackingRestoreCache` sits between the encode stage
and the packing dataset and is transparent to Energon (same samples, restore keys, state layout
and config). When the state is saved it adds, to the state of the encode stage below it, the
encoded samples the packing buffers hold (:class:`HeldSamples`, compacted when the state is
encoded or pickled, never for a state that leaves them out: see
``EnergonSFTDataLoader.state_dict_deferring``); on restore the buffers get them back by restore key.
Samples it did not save (a state saved by an older rl_data, a sample that does not rebuild
exactly) are re-encoded as before. Each Energon worker has its own copy of the pipeline, so each
saves and restores its own buffers.

A sample is saved only when it rebuilds exactly: of the encoder's sample class, with values that
survive a JSON round trip (plain JSON types) besides ``message_log``, whose messages each end
with a 1-D int64 ``token_ids`` tensor and hold such values otherwise (media tensors do not: such
samples are re-encoded). Each is saved as one zstd blob (its token ids as int32, then the JSON of the rest),
made once per sample (states of version 1 hold zlib blobs: still restored). The saved samples carry the encoder's fingerprint (adapter and component
versions); a state of another encoder (which the loader identity refuses anyway) is restored by
re-encoding.
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any

import pyarrow as pa
import torch
from megatron.energon.epathlib import EPath
from megatron.energon.flavors.base_dataset import SavableDataset
from megatron.energon.source_info import SourceInfo
from megatron.energon.wrappers.base import BaseWrapperDataset
from megatron.energon.wrappers.packing_dataset import PackingDataset

from rl_data.energon.compat import internals
from rl_data.energon.state_codec import DeferredValue

#: Key of the saved samples in the encode stage's state (Energon ignores unknown keys).
STATE_KEY = "rl_data_packing_restore"
_VERSION = 2
#: Versions restored: 1 saved zlib blobs (no ``size``), 2 saves zstd blobs with their ``size``.
_READABLE_VERSIONS = (1, 2)
_INT32 = torch.iinfo(torch.int32)
_DTYPE = operator.attrgetter("dtype")
_CODEC = "zstd"  # 60 us per sample, 0.42 of raw (zlib level 1: 149 us, 0.41; lz4: 24 us, 0.56); ~80 new per packed state
_UNSEEN = object()  # a sample not compacted yet
#: Fields rebuilt apart from the plain ones.
_SPECIAL_FIELDS = ("__restore_key__", "__sources__", "message_log")


@dataclass(frozen=True, slots=True)
class _Saved:
    """One encoded sample: ``blob`` is zstd (or, with ``size`` None, zlib) of its token ids (int32)
    then the JSON of its plain fields, sources and messages without ``token_ids``; ``counts`` the
    tokens of each message; ``size`` the length of the uncompressed bytes."""

    blob: bytes
    counts: list[int]
    size: int | None

    def to_state(self) -> dict[str, Any]:
        state = {"blob": self.blob, "counts": self.counts}
        return state if self.size is None else {**state, "size": self.size}

    def raw(self) -> bytes:
        if self.size is None:
            return zlib.decompress(self.blob)
        # zstd frames hold their size: a wrong one raises
        return pa.decompress(self.blob, decompressed_size=self.size, codec=_CODEC, asbytes=True)


class PackingRestoreCache(BaseWrapperDataset):
    """Passes the encoded samples through; saves and restores those the packing buffers hold.

    Build it on the encode stage, build the packing on it and call :meth:`feeding` with the
    result, so it knows the packing dataset whose buffers it saves.
    """

    def __init__(
        self, dataset: SavableDataset, *, sample_type: type, fingerprint: str, worker_config: Any
    ) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self._sample_type = sample_type
        self._plain_fields = tuple(
            f.name for f in dataclasses.fields(sample_type) if f.name not in _SPECIAL_FIELDS
        )
        self._fingerprint = fingerprint
        self._packing: PackingDataset | None = None
        self._paths: dict[str, EPath] = {}
        self.reset_state_own()

    def feeding(self, batched: SavableDataset) -> SavableDataset:
        """``batched`` (Energon's batching built on this cache), once its packing dataset is known."""
        packing = batched if isinstance(batched, PackingDataset) else internals.find_wrapped(batched, PackingDataset)
        if packing is None or packing.dataset is not self:
            raise RuntimeError(
                f"PackingRestoreCache: found no PackingDataset reading from this cache in {batched}; "
                "expected Energon's batching built with packing_buffer_size on this cache"
            )
        self._packing = packing
        return batched

    def reset_state_own(self) -> None:
        #: restore key -> saved sample, or None for a sample that does not rebuild exactly
        self._saved: dict[Any, _Saved | None] = {}

    def len_worker(self, worker_idx: int | None = None) -> int:
        return self.dataset.len_worker(worker_idx)

    def __iter__(self) -> Iterator[Any]:
        yield from self.dataset

    def config(self) -> dict[str, Any]:
        return self.dataset.config()  # transparent: the pipeline's config is unchanged

    def __str__(self) -> str:
        return f"PackingRestoreCache(dataset={self.dataset})"

    def save_state(self) -> Any:
        """The encode stage's state, plus the encoded samples of the packing buffers (made when
        the state is encoded or pickled: :class:`HeldSamples`)."""
        state = self.dataset.save_state()
        state[STATE_KEY] = HeldSamples(self, self._capture())
        return state

    def restore_state(self, state: Any) -> None:
        self.dataset.restore_state(state)
        saved = state.get(STATE_KEY)
        self._saved = self._from_state(saved.resolve() if isinstance(saved, HeldSamples) else saved)

    def restore_sample(self, restore_key: Any) -> Any:
        saved = self._saved.get(restore_key)
        if saved is None:
            return self.dataset.restore_sample(restore_key)
        return self._rebuild(restore_key, saved)

    def _held(self) -> Iterator[tuple[Any, Any]]:
        """``(restore key, sample or None)`` of every sample in the packing buffers; the sample is
        None while a buffer waits to be restored (it then holds only keys)."""
        for buffer in internals.packing_buffers(self._packing):
            keys, samples = buffer.restore_key(), buffer.buffer
            if len(samples) == len(keys):
                yield from zip(keys, samples)
            else:
                yield from ((key, None) for key in keys)

    def _capture(self) -> list[tuple[Any, Any]]:
        """``(restore key, item)`` of every sample the buffers hold, the item its saved form (None:
        it does not rebuild exactly) or, not compacted yet, the sample itself (never changed once
        encoded); forgets the saved forms of samples the buffers no longer hold."""
        saved, kept, held = self._saved, {}, []
        for key, sample in self._held():
            if key in saved:
                kept[key] = saved[key]
                held.append((key, saved[key]))
            elif sample is not None:
                held.append((key, sample))
        self._saved = kept
        return held

    def _resolve(self, held: list[tuple[Any, Any]]) -> dict[str, Any]:
        """The saved form of a :meth:`_capture`; a sample is compacted once while it is held. May
        run beside the loader's thread: it only reads and adds to ``_saved`` (an addition lost to
        :meth:`_capture` replacing it costs one more compaction later, never a wrong sample)."""
        keys, samples = [], []
        for key, item in held:
            if item is not None and type(item) is not _Saved:
                sample, item = item, self._saved.get(key, _UNSEEN)
                if item is _UNSEEN:
                    item = self._saved[key] = self._compact(sample)
            if item is not None:
                keys.append(key)
                samples.append(item.to_state())
        return {"version": _VERSION, "fingerprint": self._fingerprint, "restore_keys": keys, "samples": samples}

    def _from_state(self, value: Any) -> dict[Any, _Saved | None]:
        if value is None:
            return {}  # saved by an older rl_data: the buffers are re-encoded
        if not isinstance(value, dict) or value.get("version") not in _READABLE_VERSIONS:
            found = value.get("version") if isinstance(value, dict) else type(value).__name__
            raise ValueError(
                f"the saved packing buffer samples ({STATE_KEY}) have version {found!r}, expected "
                f"one of {_READABLE_VERSIONS}; the checkpoint was saved by another rl_data version, restore it with "
                "that version or from another checkpoint"
            )
        if value.get("fingerprint") != self._fingerprint:
            return {}  # another encoder's samples: re-encode them
        keys, samples = value.get("restore_keys"), value.get("samples")
        if not (isinstance(keys, list) and isinstance(samples, list) and len(keys) == len(samples)) or not all(
            isinstance(s, dict) and type(s.get("blob")) is bytes and isinstance(s.get("counts"), list)
            and (s.get("size") is None or type(s["size"]) is int)
            for s in samples
        ):
            raise _damaged("expected equally long lists of restore keys and of {blob, counts, size} samples")
        return {key: _Saved(s["blob"], s["counts"], s.get("size")) for key, s in zip(keys, samples)}

    def _compact(self, sample: Any) -> _Saved | None:
        """``sample`` as a :class:`_Saved`, or None when it would not rebuild exactly."""
        if type(sample) is not self._sample_type:
            return None
        sources = _source_rows(sample.__sources__, self._path)
        split = _split_token_ids(sample.message_log)
        if sources is False or split is None:
            return None
        messages, ids = split
        fields = {name: getattr(sample, name) for name in self._plain_fields}
        if not (_all_str(messages) or _plain_json(messages)) or not _plain_json([fields, sources]):
            return None  # a tuple, a non-str key, a NaN, an enum: would not rebuild exactly
        document = {"fields": fields, "sources": sources, "messages": messages}
        try:
            encoded = json.dumps(document, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return None  # a lone surrogate
        flat = torch.cat(ids)
        low, high = torch.aminmax(flat)
        if int(low) < _INT32.min or int(high) > _INT32.max:
            return None
        raw = flat.to(torch.int32).numpy().tobytes() + encoded
        return _Saved(pa.compress(raw, codec=_CODEC, asbytes=True), [int(t.numel()) for t in ids], len(raw))

    def _rebuild(self, restore_key: Any, saved: _Saved) -> Any:
        try:
            raw = saved.raw()
            size = 4 * sum(saved.counts)
            document = json.loads(raw[size:].decode("utf-8"))
            token_ids = torch.frombuffer(bytearray(raw[:size]), dtype=torch.int32).to(torch.int64)
            messages = document["messages"]
            if len(messages) != len(saved.counts):
                raise ValueError(f"{len(messages)} messages for {len(saved.counts)} token counts")
            pieces = torch.split(token_ids, saved.counts)
        except (zlib.error, OSError, pa.ArrowException, UnicodeDecodeError, ValueError, TypeError, KeyError, RuntimeError) as error:
            raise _damaged(f"sample {restore_key!r}: {error}") from None
        for message, ids in zip(messages, pieces):
            message["token_ids"] = ids
        sources = document["sources"]
        if sources is not None:
            sources = tuple(
                SourceInfo(dataset_path=self._path(path), index=index, shard_name=shard, file_names=tuple(files))
                for path, index, shard, files in sources
            )
        return self._sample_type(
            __restore_key__=restore_key, __sources__=sources, message_log=messages, **document["fields"]
        )

    def _path(self, url: str) -> EPath:
        path = self._paths.get(url)
        if path is None:
            path = self._paths[url] = EPath(url)
        return path


class HeldSamples(DeferredValue):
    """The samples a packing cache's buffers held when a state was saved; resolves to their saved
    form (~190 us of compaction per sample not saved before), so a state that leaves it out (a
    rank's state after every batch) does not pay for it."""

    __slots__ = ("_cache", "_held")

    def __init__(self, cache: PackingRestoreCache, held: list[tuple[Any, Any]]) -> None:
        self._cache, self._held = cache, held

    def resolve(self) -> dict[str, Any]:
        return self._cache._resolve(self._held)


def _damaged(found: str) -> ValueError:
    return ValueError(
        f"the saved packing buffer samples ({STATE_KEY}) are damaged ({found}); restore from "
        "another checkpoint"
    )


def _split_token_ids(log: Any) -> tuple[list[dict[str, Any]], list[torch.Tensor]] | None:
    """The messages of ``log`` without their ``token_ids``, and those ids; None unless every
    message is a dict whose last key is ``token_ids`` (rebuilt messages get it last), a 1-D int64
    tensor. One pass over the messages: this runs on every sample the packing buffers take."""
    messages, ids = [], []
    for message in log:
        if type(message) is not dict or next(reversed(message), None) != "token_ids":
            return None
        rest = message.copy()
        ids.append(rest.pop("token_ids"))
        messages.append(rest)
    if not ids or set(map(type, ids)) != {torch.Tensor}:
        return None
    if set(map(_DTYPE, ids)) != {torch.int64} or set(map(torch.Tensor.dim, ids)) != {1}:
        return None
    return messages, ids


def _all_str(messages: list[dict[str, Any]]) -> bool:
    """Whether every key and value of every message is a str (the usual chat message: the fast check)."""
    keys = set(map(type, chain.from_iterable(messages)))
    values = set(map(type, chain.from_iterable(map(dict.values, messages))))
    return keys <= {str} and values <= {str}


def _plain_json(value: Any) -> bool:
    """Whether ``value`` comes back equal, and of the same types, from a JSON round trip (checked
    by type: ~3x cheaper than the round trip itself, on every sample the buffers take)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is dict:
        return all(type(key) is str and _plain_json(item) for key, item in value.items())
    if kind is list:
        return all(_plain_json(item) for item in value)
    return False


def _source_rows(sources: Any, path_of: Any) -> list[list[Any]] | None | bool:
    """``__sources__`` as JSON rows, None for None, False when they would not rebuild exactly."""
    if sources is None:
        return None
    if type(sources) is not tuple:
        return False
    rows = []
    for source in sources:
        if type(source) is not SourceInfo or type(source.dataset_path) is not EPath:
            return False
        if type(source.file_names) is not tuple:
            return False
        row = [str(source.dataset_path), source.index, source.shard_name, list(source.file_names)]
        if path_of(row[0]) != source.dataset_path:
            return False
        rows.append(row)  # plain JSON: checked with the rest of the sample
    return rows
