"""What a saved loader state must agree with before it is restored.

Energon restores a rank state into any loader built with compatible shapes and silently yields
other samples when the dataset, rank, world size, shuffle buffer, ... changed: it checks almost
none of these itself. The loader identity pins all of these as plain JSON; a restore compares
the saved identity with the current one and refuses with one ``path old -> new`` line per
change (:func:`restore_differences`). Everything here is pure except
:func:`_dataset_index_uuid`, which reads one small file.

A dataset copied byte for byte to another path restores: ``source.path`` stays in the identity,
but a restore ignores a path change when both identities carry the same dataset content
identity (``dataset.index_uuid``, copied with the dataset; rl_data's writer derives it from the
shard contents). Other content at any path, or a dataset without an index uuid at another path,
is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rl_data.energon.config import EnergonLoaderConfig, EnergonSourceConfig
from rl_data.energon.mixture import weight_change_lines
from rl_data.fingerprint import brief, differences, fingerprint

#: Ends an identity refusal whose only differences are mixture weights.
REWEIGHT_HINT = (
    "; only mixture weights changed: to continue with the new weights from each member's restored "
    "position, restore with reweight=True"
)

#: Version of the loader state envelope (see ``EnergonSFTDataLoader.state_dict``).
_V2_STATE_FORMAT_VERSION = 2
#: The loader state's format name (its ``backend`` key; :mod:`rl_data.stateful`).
LOADER_STATE_FORMAT = "energon"
#: How Energon maps samples to shards: contiguous ranges, one per (rank, worker).
_MAPPER = "energon_contiguous_ranges"
_ADAPTER_FINGERPRINT = "adapter.fingerprint "


def restore_differences(saved: Any, current: Mapping[str, Any]) -> list[str]:
    """The changes that refuse restoring a state saved with identity ``saved`` ([] = restores).

    :func:`rl_data.fingerprint.differences`, except that a change of ``source.path`` alone is allowed when
    ``dataset.index_uuid`` is the same (the dataset was copied), and ``adapter.fingerprint`` is
    not listed when the adapter fields it is computed from are. An identity saved before tasks
    had options (no ``task`` entry) matches a task with the default options of the same name.
    """
    if _before_task_options(saved, current):
        saved = {**saved, "task": current["task"]}
    if _same_dataset_content(saved, current):
        saved = {**saved, "source": {**saved["source"], "path": current["source"]["path"]}}
    lines = differences(saved, current)
    explained = any(
        line.startswith("adapter.") and not line.startswith(_ADAPTER_FINGERPRINT) for line in lines
    )
    if explained:
        lines = [line for line in lines if not line.startswith(_ADAPTER_FINGERPRINT)]
    return lines


def check_restorable(
    saved: Any,
    current: Mapping[str, Any],
    *,
    reweight: bool = False,
    saved_fingerprint: Any = None,
    where: str = "",
    reweight_hint: str = REWEIGHT_HINT,
) -> list[str]:
    """Refuse a state saved with identity ``saved`` for a loader of identity ``current``
    (``ValueError``: ``"<where>Energon loader identity changed: <path old -> new>; ..."``, ending
    with ``reweight_hint`` when only mixture weights differ); return the weight-change lines
    accepted with ``reweight``. ``saved_fingerprint``, when given, must be ``saved``'s own (a
    state whose identity was edited is refused)."""
    changes = restore_differences(saved, current)
    reweighted = weight_change_lines(changes)
    lines = [line for line in changes if not (reweight and line in reweighted)]
    if not lines and saved_fingerprint is not None and saved_fingerprint != fingerprint(saved):
        lines = [f"fingerprint {brief(saved_fingerprint)} -> {brief(fingerprint(saved))}"]
    if lines:
        hint = reweight_hint if reweighted and not reweight and len(reweighted) == len(lines) else ""
        raise ValueError(f"{where}Energon loader identity changed: " + "; ".join(lines) + hint)
    return reweighted if reweight else []


def _before_task_options(saved: Any, current: Mapping[str, Any]) -> bool:
    """``saved`` has no ``task`` entry and ``current`` runs the task its loader names, with no options."""
    task = current.get("task")
    return (
        isinstance(saved, Mapping)
        and "task" not in saved
        and isinstance(task, Mapping)
        and task.get("config") == {}
        and isinstance(saved.get("loader"), Mapping)
        and task.get("name") == saved["loader"].get("task_encoder")
    )


def _same_dataset_content(saved: Any, current: Mapping[str, Any]) -> bool:
    """Both identities have a ``source.path`` and the same known ``dataset.index_uuid``."""
    for identity in (saved, current):
        if not (
            isinstance(identity, Mapping)
            and isinstance(identity.get("source"), Mapping)
            and "path" in identity["source"]
            and isinstance(identity.get("dataset"), Mapping)
        ):
            return False
    uuid = saved["dataset"].get("index_uuid")
    return isinstance(uuid, str) and uuid == current["dataset"].get("index_uuid")


def _v2_topology(
    *,
    loader_config: EnergonLoaderConfig,
    placement_fingerprint: str,
    logical_rank: int,
    logical_world_size: int,
) -> dict[str, Any]:
    """Describe the DP shard a V2 loader state belongs to.

    This is what makes one DP shard refuse another shard's state, so it is hashed into the
    loader identity by :func:`_loader_identity`. ``mapper`` names how Energon cuts the split
    into ``slices`` contiguous ranges (one per rank and worker).
    """
    return {
        "mapper": {
            "kind": _MAPPER,
            "slices": logical_world_size * max(1, loader_config.num_workers),
        },
        "placement": placement_fingerprint,
        "logical_rank": logical_rank,
        "logical_world_size": logical_world_size,
    }


def _dataset_index_uuid(path: str) -> str | None:
    """The dataset's own identity, ``.nv-meta/index.uuid`` (None if the file is missing)."""
    from megatron.energon.epathlib import EPath

    uuid_file = EPath(path) / ".nv-meta" / "index.uuid"
    return uuid_file.read_text().strip() if uuid_file.is_file() else None


def _loader_identity(
    *,
    source: EnergonSourceConfig,
    loader_config: EnergonLoaderConfig,
    adapter: Mapping[str, Any],
    split_role: str,
    batch_size: int,
    shuffle: bool | None,
    topology: dict[str, Any],
    packing_algorithm: str | None,
    max_sequences_per_bin: int | None,
    sequence_length_pad_multiple: int,
    only_unmask_final: bool,
    mixture: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Describe what a restored loader must still agree with.

    ``adapter`` is the processor adapter's ``identity_summary`` (its fields and fingerprint).
    The four packing keys are present only when packing is on: without packing,
    ``only_unmask_final`` is applied after the loader and does not change its state.
    ``mixture`` (:func:`rl_data.energon.mixture.mixture_members`) describes every member of a
    mixture source by name (path, weight, index uuid); it replaces the source's member list.
    """
    identity: dict[str, Any] = {
        "source": source.model_dump(mode="json", exclude={"mixture"}),  # members: under "mixture"
        "dataset": {"index_uuid": None if source.is_mixture else _dataset_index_uuid(source.path)},
        "loader": loader_config.identity_dump(),
        "adapter": dict(adapter),
        "split_role": split_role,
        "batch_size": batch_size,
        "shuffle": shuffle,
        "state_format_version": _V2_STATE_FORMAT_VERSION,
        "topology": dict(topology),
    }
    if mixture is not None:
        identity["mixture"] = dict(mixture)
    if packing_algorithm is not None:
        identity["packing_algorithm"] = packing_algorithm
        identity["max_sequences_per_bin"] = max_sequences_per_bin
        identity["sequence_length_pad_multiple"] = sequence_length_pad_multiple
        identity["only_unmask_final"] = only_unmask_final
    return json.loads(json.dumps(identity))
