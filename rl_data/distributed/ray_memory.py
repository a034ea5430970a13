"""What a Ray worker process holds in memory, for ``status()`` and the soak benchmark."""

from __future__ import annotations

from typing import Optional


def objects_in_memory() -> Optional[int]:
    """Objects in this worker's in-process store (owned small objects, and markers of objects in
    the shared object store); None outside a Ray worker."""
    import ray

    worker = ray._private.worker.global_worker  # Ray has no public accessor for its core worker's store
    core_worker = getattr(worker, "core_worker", None)
    return None if core_worker is None else int(core_worker.get_memory_store_size())
