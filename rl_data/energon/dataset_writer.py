"""Write WebDataset tar shards and prepare them as a Megatron-Energon dataset.

Shards are byte-deterministic (fixed member order, mtime 0, no owner names), so the same
samples always give the same bytes. Splits are assigned either per shard, in shard order, by
:func:`assign_splits` (:func:`write_energon_dataset`; a ratio that would leave a requested
split empty is refused before anything is prepared), or per sample by :class:`SplitAssigner`
with one set of shards per split (the preprocessing job; :func:`prepare_energon_splits`). ``.nv-meta/index.uuid`` is replaced by a UUID derived from the shard
contents, so re-preparing identical data keeps the dataset identity and any change of data
changes it.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import re
import tarfile
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from rl_data.energon.index_process import run_energon_prepare

#: One sample as written to a shard: its key and its members (extension -> bytes).
TarSample = tuple[str, Mapping[str, bytes]]

_KEY_PATTERN = re.compile(r"^[A-Za-z0-9_\-]+$")
_DATASET_YAML = "__module__: megatron.energon\n__class__: CrudeWebdataset\n"
_UUID_NAMESPACE = uuid.UUID("7b0f3f0e-6f1c-4f7e-9c1a-2d4b7e0e5a11")
DEFAULT_SPLITS: dict[str, float] = {"train": 0.8, "val": 0.1, "test": 0.1}


def write_tar_shard(path: str | Path, samples: Iterable[TarSample]) -> int:
    """Write ``samples`` to the tar ``path`` atomically; return the number of samples."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    count = 0
    with tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as tar:
        for key, members in samples:
            if not _KEY_PATTERN.match(key):
                raise ValueError(
                    f"sample key {key!r} is not a valid WebDataset key: use letters, digits, "
                    "'_' and '-' only (a '.' would split the key from the member name)"
                )
            for extension in sorted(members):
                data = members[extension]
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
            count += 1
    os.replace(tmp, path)
    return count


def assign_splits(num_shards: int, ratios: Mapping[str, float]) -> dict[str, list[int]]:
    """Assign shard indices to splits in order, proportionally to ``ratios``.

    Uses largest-remainder rounding so every shard lands in exactly one split. Raises
    ``ValueError`` if a split with a positive ratio would get no shard.
    """
    requested = {name: float(r) for name, r in ratios.items() if r > 0}
    if not requested or any(r < 0 for r in ratios.values()):
        raise ValueError(f"split ratios must be >= 0 with at least one positive, got {dict(ratios)}")
    total = sum(requested.values())
    exact = {name: num_shards * r / total for name, r in requested.items()}
    counts = {name: math.floor(v) for name, v in exact.items()}
    by_remainder = sorted(requested, key=lambda n: (-(exact[n] - counts[n]), list(requested).index(n)))
    for name in by_remainder[: num_shards - sum(counts.values())]:
        counts[name] += 1
    empty = [name for name, c in counts.items() if c == 0]
    if empty:
        needed = math.ceil(total / min(requested[n] for n in empty))
        raise ValueError(
            f"split ratios {requested} with {num_shards} shard(s) leave split(s) {empty} empty "
            f"(splits are assigned per shard); write at least {needed} shards (smaller "
            "target shard size) or drop those splits"
        )
    assignment, start = {}, 0
    for name in requested:
        assignment[name] = list(range(start, start + counts[name]))
        start += counts[name]
    return assignment


class SplitAssigner:
    """Assigns samples to splits one by one, in order, each to the split furthest below its share.

    After ``n`` samples every split ``s`` holds ``floor`` or ``ceil`` of ``n * ratio_s / total``
    (ties go to the split named first), so the counts follow the ratios at every prefix and a
    small input still reaches every split (see :func:`min_samples_for_splits`).
    """

    def __init__(self, ratios: Mapping[str, float]):
        self.ratios = {name: float(r) for name, r in ratios.items() if r > 0}
        if not self.ratios or any(r < 0 for r in ratios.values()):
            raise ValueError(f"split ratios must be >= 0 with at least one positive, got {dict(ratios)}")
        self.names = list(self.ratios)
        self._total = sum(self.ratios.values())
        self._counts = dict.fromkeys(self.names, 0)
        self._assigned = 0

    def next(self) -> str:
        """The split of the next sample."""
        self._assigned += 1
        name = max(self.names, key=lambda n: self._assigned * self.ratios[n] / self._total - self._counts[n])
        self._counts[name] += 1
        return name


def min_samples_for_splits(ratios: Mapping[str, float]) -> int:
    """How many samples :class:`SplitAssigner` needs before every requested split has one."""
    assigner, seen, count = SplitAssigner(ratios), set(), 0
    while len(seen) < len(assigner.names):
        seen.add(assigner.next())
        count += 1
    return count


def content_uuid(root: str | Path, shard_paths: Sequence[str]) -> str:
    """A UUID derived from the shard names and bytes (stable for identical data)."""
    digest = hashlib.sha256()
    for rel in shard_paths:
        digest.update(rel.encode() + b"\0")
        with open(Path(root) / rel, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return str(uuid.uuid5(_UUID_NAMESPACE, digest.hexdigest()))


def prepare_energon_dataset(
    root: str | Path,
    shard_paths: Sequence[str],
    *,
    splits: Mapping[str, float] = DEFAULT_SPLITS,
    workers: int = 1,
) -> dict[str, list[str]]:
    """Index the shards with Energon (``.nv-meta``) and write the split and dataset configs.

    ``shard_paths`` are relative to ``root``. Returns ``{split: [shard paths]}``.
    """
    if not shard_paths:
        raise ValueError(f"no shards to prepare in {root}")
    assignment = assign_splits(len(shard_paths), splits)
    split_shards = {name: [shard_paths[i] for i in idx] for name, idx in assignment.items()}
    prepare_energon_splits(root, split_shards, workers=workers)
    return split_shards


def prepare_energon_splits(
    root: str | Path,
    split_shards: Mapping[str, Sequence[str]],
    *,
    workers: int = 1,
    timeout_s: float | None = None,
) -> None:
    """Index the shards with Energon (``.nv-meta``), each split holding the given shard paths
    (relative to ``root``; every split non-empty), and write the dataset config and index UUID.

    Energon indexes in a fresh Python process (:mod:`rl_data.energon.index_process`), safe to call
    from a Ray driver or any process with threads; ``timeout_s`` bounds it (``None``: no bound).
    """
    root = Path(root)
    empty = [name for name, paths in split_shards.items() if not paths]
    if empty or not split_shards:
        raise ValueError(f"splits {empty or '(none)'} have no shards in {root}; every split needs at least one")
    shard_paths = [path for paths in split_shards.values() for path in paths]
    patterns = [
        (name, "(?:" + "|".join(re.escape(p) for p in paths) + ")$")
        for name, paths in split_shards.items()
    ]
    run_energon_prepare(root, shard_paths, patterns, workers=workers, timeout_s=timeout_s)
    meta = root / ".nv-meta"
    (meta / "dataset.yaml").write_text(_DATASET_YAML)
    (meta / "index.uuid").write_text(content_uuid(root, sorted(shard_paths)))


def write_energon_dataset(
    root: str | Path,
    samples: Iterable[TarSample],
    *,
    samples_per_shard: int,
    splits: Mapping[str, float] = DEFAULT_SPLITS,
) -> dict[str, list[str]]:
    """Write ``samples`` as shards of ``samples_per_shard`` under ``root/shards`` and prepare.

    A small, single-process writer for tests, demos and tools; the Ray Data preprocessing job
    writes shards in parallel with :func:`write_tar_shard` and then calls
    :func:`prepare_energon_dataset`.
    """
    if samples_per_shard < 1:
        raise ValueError(f"samples_per_shard must be >= 1, got {samples_per_shard}")
    root = Path(root)
    shard_paths: list[str] = []
    batch: list[TarSample] = []

    def flush() -> None:
        rel = f"shards/shard-{len(shard_paths):06d}.tar"
        write_tar_shard(root / rel, batch)
        shard_paths.append(rel)
        batch.clear()

    for sample in samples:
        batch.append(sample)
        if len(batch) == samples_per_shard:
            flush()
    if batch:
        flush()
    return prepare_energon_dataset(root, shard_paths, splits=splits)
