"""Write the transformed rows: shards, quarantine file and token statistics, into a staged folder.

Why the driver writes the shards (scale and determinism): shard boundaries must depend only on
the input, so they are placed by one ordered pass over the rows (sorted by ``(file, row)``
because the job runs Ray Data with ``preserve_order``) that cuts a shard when the target size
in bytes or rows is reached. Everything expensive (reading, parsing, adapting, validating,
tokenizing, JSON encoding) has already run in parallel Ray tasks on every core and node; what
remains here is appending ready bytes to a tar file at disk speed while Ray keeps prefetching.
Memory stays bounded: one shard buffer plus Ray's prefetch window; token lengths are kept as a
histogram (size = longest sample), not a list. A sample's media members are written next to its
JSON (``<key>.json``, ``<key>.image-0.jpg``, ...) and their bytes count toward
``target_shard_bytes``, so shards of large media stay near the target size. Output therefore needs to be writable by the
driver only, but must be on storage every training node can read.

**Splits are assigned per sample**, in row order, each accepted sample going to the requested
split furthest below its share (:func:`~rl_data.energon.dataset_writer.SplitAssigner`); each
split has its own shards (``shards/<split>-000000.tar``). Any input with at least
:func:`~rl_data.energon.dataset_writer.min_samples_for_splits` accepted samples fills every
split, whatever the shard size; the counts match the ratios to within one sample.

**Duplicates** (accepted rows whose canonical sample and media equal an earlier one's, by a
64-bit content hash) are kept and counted (``counts.duplicates`` in ``dataset_info.json``).

**Failed-rows budget**: the writer raises :class:`FailedRowsBudgetExceeded` as soon as the
quarantined rows, not counting rows the job's own limits filter (``too_long``), exceed
``max(max_failed_rows, max_failed_fraction * rows read so far)``.

:func:`staged_output` gives the atomicity: everything is written into a hidden sibling folder
that is renamed onto the output path only after the job finished, and deleted on any failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rl_data.energon import dataset_writer
from rl_data.energon.sample_format import SAMPLE_MEMBER
from rl_data.preprocess.validation import FILTER_REASONS

#: Bytes counted per tar member on top of its data (header and padding, roughly).
MEMBER_OVERHEAD = 1024
QUARANTINE_FILE = "quarantine.jsonl"
SHARD_FOLDER = "shards"


def refuse_existing_output(output: str | os.PathLike, *, overwrite: bool) -> None:
    """``FileExistsError`` if ``output`` exists and ``overwrite`` is off."""
    if Path(output).exists() and not overwrite:
        raise FileExistsError(f"output {output} already exists; pass overwrite=True (--overwrite) to replace it")


@contextlib.contextmanager
def staged_output(output: str | os.PathLike, *, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary folder next to ``output``; on success it replaces ``output`` atomically.

    Refuses an existing ``output`` unless ``overwrite``. On any exception the temporary folder is
    removed and ``output`` is left as it was.
    """
    output = Path(output).absolute()
    refuse_existing_output(output, overwrite=overwrite)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = output.with_name(f".{output.name}.tmp-{uuid.uuid4().hex[:12]}")
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    retired = output.with_name(f".{output.name}.old-{uuid.uuid4().hex[:12]}")
    if output.exists():
        os.replace(output, retired)
    os.replace(staging, output)
    shutil.rmtree(retired, ignore_errors=True)


class FailedRowsBudgetExceeded(ValueError):
    """More rows failed than the job's budget allows: the input or the adapter is broken."""


@dataclass(frozen=True)
class FailureBudget:
    """Fail once failed rows exceed ``max(max_rows, max_fraction * rows read)``."""

    max_fraction: float = 0.01
    max_rows: int = 100

    def allowed(self, read: int) -> int:
        return max(self.max_rows, int(self.max_fraction * read))


@dataclass
class ShardRecord:
    """One written shard: path relative to the dataset root, split, sample count, size, first/last key."""

    path: str
    split: str
    samples: int
    bytes: int
    first_key: str
    last_key: str


@dataclass
class WriteStats:
    """What the writer saw: counts, shards, media members and bytes, token-length histogram."""

    read: int = 0
    duplicates: int = 0
    media_members: int = 0
    media_bytes: int = 0
    accepted_by_kind: dict[str, int] = field(default_factory=dict)
    quarantined_by_reason: dict[str, int] = field(default_factory=dict)
    shards: list[ShardRecord] = field(default_factory=list)
    token_histogram: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def accepted(self) -> int:
        return sum(self.accepted_by_kind.values())

    @property
    def quarantined(self) -> int:
        return sum(self.quarantined_by_reason.values())

    @property
    def failed(self) -> int:
        """Quarantined rows that count against the budget (not filtered by the job's limits)."""
        return sum(n for reason, n in self.quarantined_by_reason.items() if reason not in FILTER_REASONS)


class DatasetWriter:
    """Consume transformed batches in ``(file, row)`` order; write shards and the quarantine file."""

    def __init__(
        self, root: Path, *, target_shard_bytes: int, target_shard_rows: int | None,
        splits: dict[str, float] | None = None, budget: FailureBudget | None = None,
    ):
        self.root = root
        self.target_shard_bytes = target_shard_bytes
        self.target_shard_rows = target_shard_rows
        self.budget = budget or FailureBudget()
        self.stats = WriteStats()
        self._assigner = dataset_writer.SplitAssigner(splits or {"train": 1.0})
        self._buffers: dict[str, list[tuple[str, dict[str, bytes]]]] = {name: [] for name in self._assigner.names}
        self._buffer_bytes = dict.fromkeys(self._assigner.names, 0)
        self._shard_counts = dict.fromkeys(self._assigner.names, 0)
        self._hashes: set[int] = set()
        self._last: tuple[str, int] | None = None
        self._first_failure: str = ""
        self._quarantine = open(root / QUARANTINE_FILE, "w", encoding="utf-8")

    def add_batch(self, batch: pa.Table) -> None:
        """Add one batch of ``transform.OUTPUT_SCHEMA`` rows."""
        columns = batch.to_pydict()
        lengths = []
        for i, (file, row) in enumerate(zip(columns["file"], columns["row"])):
            self._check_order(file, row)
            self.stats.read += 1
            if columns["accepted"][i]:
                kind = columns["kind"][i]
                self.stats.accepted_by_kind[kind] = self.stats.accepted_by_kind.get(kind, 0) + 1
                lengths.append(columns["num_tokens"][i])
                self._count_duplicate(columns["content_hash"][i])
                media = {m["name"]: m["data"] for m in columns["media"][i]}
                self._add_sample(columns["key"][i], {SAMPLE_MEMBER: columns["payload"][i], **media})
            else:
                reason = columns["reason"][i]
                self.stats.quarantined_by_reason[reason] = self.stats.quarantined_by_reason.get(reason, 0) + 1
                record = {"file": file, "row": row, "reason": reason, "message": columns["message"][i],
                          "raw": columns["raw"][i]}
                self._quarantine.write(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n")
                if reason not in FILTER_REASONS and not self._first_failure:
                    self._first_failure = f"{file} row {row}: {reason}: {columns['message'][i]}"
        if lengths:
            self._add_lengths(np.asarray(lengths, dtype=np.int64))
        self._check_budget()

    def close(self) -> WriteStats:
        """Flush the last shard of every split and close the quarantine file."""
        for split, buffer in self._buffers.items():
            if buffer:
                self._flush(split)
        self._quarantine.close()
        return self.stats

    def _check_budget(self) -> None:
        failed, allowed = self.stats.failed, self.budget.allowed(self.stats.read)
        if failed <= allowed:
            return
        reasons = ", ".join(f"{r}: {n}" for r, n in sorted(self.stats.quarantined_by_reason.items())
                            if r not in FILTER_REASONS)
        raise FailedRowsBudgetExceeded(
            f"{failed} of the first {self.stats.read} rows failed ({reasons}), more than the budget of "
            f"{allowed} (max of --max-failed-rows {self.budget.max_rows} and --max-failed-fraction "
            f"{self.budget.max_fraction} of the rows read); first: {self._first_failure[:300]}. Fix the input "
            "or the adapter (--adapter), or raise the budget"
        )

    def _count_duplicate(self, digest: int) -> None:
        if digest in self._hashes:
            self.stats.duplicates += 1
        else:
            self._hashes.add(digest)

    def _check_order(self, file: str, row: int) -> None:
        if self._last is not None and (file, row) <= self._last:
            raise RuntimeError(
                f"rows reached the writer out of order: ({file!r}, {row}) after {self._last}; "
                "the job must run Ray Data with preserve_order=True for deterministic shards"
            )
        self._last = (file, row)

    def _add_sample(self, key: str, members: dict[str, bytes]) -> None:
        split = self._assigner.next()
        buffer = self._buffers[split]
        buffer.append((key, members))
        self._buffer_bytes[split] += sum(len(data) + MEMBER_OVERHEAD for data in members.values())
        self.stats.media_members += len(members) - 1
        self.stats.media_bytes += sum(len(data) for name, data in members.items() if name != SAMPLE_MEMBER)
        full_rows = self.target_shard_rows is not None and len(buffer) >= self.target_shard_rows
        if full_rows or self._buffer_bytes[split] >= self.target_shard_bytes:
            self._flush(split)

    def _flush(self, split: str) -> None:
        buffer = self._buffers[split]
        rel = f"{SHARD_FOLDER}/{split}-{self._shard_counts[split]:06d}.tar"
        count = dataset_writer.write_tar_shard(self.root / rel, buffer)
        size = (self.root / rel).stat().st_size
        self.stats.shards.append(ShardRecord(rel, split, count, size, buffer[0][0], buffer[-1][0]))
        self._shard_counts[split] += 1
        self._buffers[split], self._buffer_bytes[split] = [], 0

    def _add_lengths(self, lengths: np.ndarray) -> None:
        counts = np.bincount(lengths)
        histogram = self.stats.token_histogram
        if len(counts) > len(histogram):
            histogram = np.pad(histogram, (0, len(counts) - len(histogram)))
        histogram[: len(counts)] += counts
        self.stats.token_histogram = histogram


def token_statistics(histogram: np.ndarray) -> dict[str, Any]:
    """``{count, min, mean, p50, p95, max}`` of the lengths in a bincount histogram (exact)."""
    total = int(histogram.sum())
    if total == 0:
        return {"count": 0, "min": None, "mean": None, "p50": None, "p95": None, "max": None}
    present = np.nonzero(histogram)[0]
    cumulative = np.cumsum(histogram)

    def percentile(q: float) -> int:  # nearest-rank percentile
        return int(np.searchsorted(cumulative, max(1, int(np.ceil(q / 100 * total)))))

    mean = float((np.arange(len(histogram)) * histogram).sum() / total)
    return {"count": total, "min": int(present[0]), "mean": round(mean, 3), "p50": percentile(50),
            "p95": percentile(95), "max": int(present[-1])}


def finish_dataset(
    root: Path, stats: WriteStats, *, splits: dict[str, float], prepare_workers: int, info: dict[str, Any]
) -> dict[str, Any]:
    """Prepare the shards with Energon and write ``dataset_info.json``; return its content.

    ``info`` holds what only the job knows (inputs, config, versions); this adds counts per
    reason, kind and split, duplicates, the shard list and the token-length statistics.
    """
    if not stats.shards:
        reasons = ", ".join(f"{r}: {n}" for r, n in sorted(stats.quarantined_by_reason.items())) or "no rows read"
        raise ValueError(
            f"no row was accepted ({stats.read} read; quarantined {reasons}); nothing to write. "
            f"Check the adapter (--adapter) and the input; the reasons per row are in {QUARANTINE_FILE}"
        )
    requested = [name for name, ratio in splits.items() if ratio > 0]
    empty = [name for name in requested if not any(s.split == name for s in stats.shards)]
    if empty:
        raise ValueError(
            f"only {stats.accepted} row(s) were accepted, too few for splits {splits}: split(s) {empty} got "
            f"no sample (at least {dataset_writer.min_samples_for_splits(splits)} are needed); add rows or "
            "drop those splits (e.g. --splits train=1)"
        )
    split_shards = {name: [s.path for s in stats.shards if s.split == name] for name in requested}
    dataset_writer.prepare_energon_splits(root, split_shards, workers=prepare_workers)
    samples_of = {s.path: s.samples for s in stats.shards}
    content = {
        **info,
        "counts": {
            "read": stats.read,
            "accepted": stats.accepted,
            "quarantined": stats.quarantined,
            "accepted_by_kind": dict(sorted(stats.accepted_by_kind.items())),
            "quarantined_by_reason": dict(sorted(stats.quarantined_by_reason.items())),
            "duplicates": stats.duplicates,
        },
        "duplicates": "kept: counts.duplicates rows repeat an earlier accepted row's sample exactly "
                      "(all fields but source, and media bytes)",
        "split_method": "per sample, in row order, each to the split furthest below its ratio",
        "splits": {name: {"samples": sum(samples_of[p] for p in paths), "shards": paths}
                   for name, paths in split_shards.items()},
        "shards": [vars(s) for s in stats.shards],
        "token_lengths": token_statistics(stats.token_histogram),
        "media": {"members": stats.media_members, "bytes": stats.media_bytes},
        "quarantine_file": QUARANTINE_FILE,
        "index_uuid": (root / ".nv-meta" / "index.uuid").read_text().strip(),
    }
    (root / "dataset_info.json").write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
    return content
