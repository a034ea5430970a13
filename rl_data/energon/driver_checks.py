"""What the driver checks before anything starts, reading only metadata (no Ray, no Energon, no torch).

:func:`loader_spec_problems` lists every problem of a :class:`~rl_data.energon.loader_spec.LoaderSpec`
that the spec alone cannot show: its datasets (:func:`source_problems`) and its processor factory's
module. The entry points (``start_data_coordinator``, ``start_prompt_feed``,
``build_energon_sft_loader``) raise them as one :class:`~rl_data.config_blocks.ConfigError`.

A dataset is checked as Energon will read it: the path is a folder holding ``.nv-meta`` with the
shard counts (``.info.json``), the sample type (``dataset.yaml``) and the splits (``split.yaml``
or ``split.json``), which name the requested split with at least one shard. A metadataset
``.yaml`` must parse and name the split; the datasets its split reaches (``blend``,
``blend_epochized``, ``join``, nested metadatasets) are checked the same way, each with its own
``split_part``; an Energon JSONL dataset (a ``.jsonl`` file) is left to Energon. Only these small
files are read, never a shard or the index database. Paths
with a URL scheme (``msc://``, ``s3://``, ...) are Energon EPaths and are not checked here (that
would need Energon and the remote store): Energon checks them in the rank actors.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from rl_data.energon.config import EnergonSourceConfig
from rl_data.energon.loader_spec import LoaderSpec

#: How deep metadatasets may nest before the check stops following them (a cycle, or a mistake).
MAX_METADATASET_DEPTH = 8
#: How to fix a split a dataset lacks: named by the source, or by a metadataset entry.
_SPLIT_FIX = {
    False: "set the source's split to one of them (or prepare the dataset with that split)",
    True: "set that metadataset entry's split_part (or the source's split) to one of them",
}
_MAKE_ONE = (
    "make one with `rl-data preprocess INPUTS --output FOLDER` (raw conversations) or `energon prepare FOLDER` "
    "(WebDataset shards)"
)


def loader_spec_problems(spec: LoaderSpec, *, check_datasets: bool = True) -> list[str]:
    """Every problem of ``spec`` found on the driver: its datasets (for a task that reads an Energon
    dataset; skipped with ``check_datasets=False``, for a driver that cannot see them) and its
    processor factory's module ([]: none)."""
    reads_datasets = check_datasets and spec.task().build_loader is None
    problems = source_problems(spec.source) if reads_datasets else []
    return problems + factory_problems(spec.processor_factory)


def source_problems(source: EnergonSourceConfig) -> list[str]:
    """Every problem of the datasets ``source`` reads, in the split it reads ([]: none)."""
    if source.mixture is not None:
        return [
            problem
            for member in source.mixture
            for problem in _path_problems(member.path, source.split, f"mixture member {member.name!r}: path")
        ]
    return _path_problems(str(source.path), source.split, "source path")


def factory_problems(processor_factory: str) -> list[str]:
    """``processor_factory``'s module cannot be found on the driver (it is not imported: a module
    already imported must also define the function)."""
    module_name, _, attribute = processor_factory.partition(":")
    try:
        found = importlib.util.find_spec(module_name) is not None  # imports only its parent packages
    except ModuleNotFoundError:
        found = False
    except Exception:  # noqa: BLE001 - a parent package that fails to import here is the rank's to report
        return []
    if not found:
        return [
            f"processor_factory {processor_factory!r}: module {module_name!r} cannot be found on the driver; expected "
            "an installed module or one in the job's working dir; check the spelling, or install its package"
        ]
    module = sys.modules.get(module_name)
    if module is not None and not hasattr(module, attribute):
        return [f"processor_factory {processor_factory!r}: module {module_name!r} has no {attribute!r}; name a function it defines"]
    return []


def _path_problems(path: str, split: str, what: str, *, split_config: str | None = None, depth: int = 0) -> list[str]:
    """The problems of the dataset or metadataset at ``path`` read in ``split`` (``depth``: metadatasets
    it is nested in)."""
    if "://" in path:
        return []  # an Energon EPath (remote store): Energon checks it in the ranks
    where = Path(path)
    if not where.exists():
        return [
            f"{what} {path!r} does not exist; expected a prepared Energon dataset folder (holding .nv-meta) or a "
            f"metadataset .yaml that every node can read; check the path, or {_MAKE_ONE}"
        ]
    if where.is_file():
        if where.suffix in (".yaml", ".yml"):
            return _metadataset_problems(where, split, what, depth)
        if where.suffix == ".jsonl":
            return []  # an Energon JSONL dataset: Energon checks its index
        return [
            f"{what} {path!r} is a file, expected a prepared Energon dataset folder (holding .nv-meta) or a "
            "metadataset .yaml; point it at the dataset's root folder"
        ]
    return _dataset_problems(where, split, what, split_config, _SPLIT_FIX[depth > 0])


def _dataset_problems(root: Path, split: str, what: str, split_config: str | None, split_fix: str) -> list[str]:
    meta = root / ".nv-meta"
    if not meta.is_dir():
        return [
            f"{what} '{root}' has no .nv-meta folder, so it is not a prepared Energon dataset; expected the folder "
            f"`rl-data preprocess` writes (or `energon prepare` indexed); {_MAKE_ONE}"
        ]
    problems = []
    if not ((meta / ".info.json").is_file() or (meta / ".info.yaml").is_file()):
        problems.append(
            f"{what} '{root}' has .nv-meta but no .nv-meta/.info.json (the shard counts), so it was not prepared "
            f"completely; run `energon prepare {root}` again"
        )
    if not (meta / "dataset.yaml").is_file():
        problems.append(
            f"{what} '{root}' has no .nv-meta/dataset.yaml (the sample type); run `energon prepare {root}` again, or "
            "write it ('__module__: megatron.energon' and '__class__: CrudeWebdataset' for rl_data's datasets)"
        )
    names = [split_config] if split_config else ["split.yaml", "split.json"]
    split_file = next((meta / name for name in names if (meta / name).is_file()), None)
    if split_file is None:
        return problems + [
            f"{what} '{root}' has no .nv-meta/{names[0]} naming its splits; run `energon prepare {root}` again"
        ]
    try:
        content = _read(split_file)
    except (OSError, ValueError) as error:
        return problems + [f"{what} '{root}': {split_file} cannot be read ({error}); run `energon prepare {root}` again"]
    splits = content.get("split_parts") if isinstance(content, dict) else None
    if not isinstance(splits, dict):
        return problems + [f"{what} '{root}': {split_file} has no 'split_parts' mapping; run `energon prepare {root}` again"]
    if split not in splits:
        return problems + [
            f"{what} '{root}' has no split {split!r}; its splits are {sorted(splits)}; {split_fix}"
        ]
    if not _shards(splits[split], content.get("exclude") or []):
        problems.append(
            f"{what} '{root}': split {split!r} lists no shard; expected at least one; read another split, or prepare "
            "the dataset again with shards in this one"
        )
    return problems


def _metadataset_problems(path: Path, split: str, what: str, depth: int) -> list[str]:
    try:
        config = _read(path)
    except (OSError, ValueError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        return [f"{what} '{path}' is not a readable metadataset YAML ({first}); fix the file"]
    splits = config.get("splits") if isinstance(config, dict) else None
    if not isinstance(splits, dict):
        return [
            f"{what} '{path}' has no 'splits' mapping, so it is not an Energon metadataset; expected "
            f"'splits: {{{split}: {{blend: [{{path: ..., weight: ...}}]}}}}'"
        ]
    if split not in splits:
        return [f"{what} '{path}' has no split {split!r}; its splits are {sorted(splits)}; {_SPLIT_FIX[depth > 0]}"]
    if depth >= MAX_METADATASET_DEPTH:
        return [f"{what} '{path}' nests metadatasets more than {MAX_METADATASET_DEPTH} deep; is one of them including itself?"]
    return _reference_problems(splits[split], path.parent, split, f"metadataset '{path}' member", depth + 1)


def _reference_problems(node: Any, base: Path, split: str, what: str, depth: int) -> list[str]:
    """The problems of the datasets one metadataset node reaches (what Energon's traversal visits)."""
    if not isinstance(node, dict):
        return []
    for key in ("blend", "blend_epochized", "datasets", "join"):
        entries = node.get(key)
        if isinstance(entries, dict):
            entries = list(entries.values())
        if isinstance(entries, list):
            return [problem for entry in entries for problem in _reference_problems(entry, base, split, what, depth)]
    member = node.get("path")
    if not isinstance(member, str):
        return []
    if "://" not in member and not Path(member).is_absolute():
        member = str(base / member)
    return _path_problems(member, node.get("split_part") or split, what, split_config=node.get("split_config"), depth=depth)


def _read(path: Path) -> Any:
    """A small YAML or JSON metadata file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        return json.loads(text)
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ValueError(" ".join(str(error).split())) from None


def _shards(patterns: Any, excluded: list[str]) -> list[str]:
    """The shard names of a split's patterns (brace-expanded, as Energon does), without the excluded."""
    import braceexpand

    if not isinstance(patterns, list):
        return []
    skip = {name for pattern in excluded for name in braceexpand.braceexpand(str(pattern))}
    return [name for pattern in patterns for name in braceexpand.braceexpand(str(pattern)) if name not in skip]
