"""Preprocess several inputs as the members of one weighted mixture, in one job.

``rl-data preprocess math.jsonl code/ chat.jsonl -o /data/mix --mixture math=0.5,code=0.3,chat=0.2``
writes one Energon dataset per member (``/data/mix/math``, ...: an input belongs to the member
its file or folder name starts with, e.g. ``math.jsonl``, ``math-part2.jsonl``, ``code/``) and
``/data/mix/mixture.yaml``, an Energon metadataset that blends them by weight in every split
(member paths relative to the file, so the folder can move). Loaders read it as
``source={"path": "/data/mix/mixture.yaml", "split": "train", "epoch_mode": "virtual", ...}``.

All or nothing: the members are written into a staging folder next to the output, which is
renamed to the output only when every member succeeded.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel

MIXTURE_FILE = "mixture.yaml"
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def parse_mixture(text: str) -> dict[str, float]:
    """``"math=0.5,code=0.3"``, or a YAML file of ``{name: weight}``, as ``{name: weight}``."""
    if text.endswith((".yaml", ".yml")) and Path(text).is_file():
        import yaml

        raw = yaml.safe_load(Path(text).read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ValueError(f"mixture file {text} must map member names to weights, found {type(raw).__name__}")
        pairs = list(raw.items())
    else:
        try:
            pairs = [tuple(part.split("=", 1)) for part in text.split(",")]
            pairs = [(name.strip(), value) for name, value in pairs]
        except ValueError:
            pairs = []
        if not pairs or any(len(p) != 2 for p in pairs):
            raise ValueError(f"expected NAME=WEIGHT[,NAME=WEIGHT...] like 'math=0.5,code=0.5' or a YAML file, found {text!r}")
    weights: dict[str, float] = {}
    for name, value in pairs:
        try:
            weight = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"mixture weight of {name!r} is {value!r}, expected a number > 0") from None
        if not _NAME.match(str(name)) or weight <= 0 or name in weights:
            raise ValueError(
                f"mixture member {name!r}={value!r}: names are letters, digits, '_', '.', '-' and unique, "
                "weights are numbers > 0"
            )
        weights[str(name)] = weight
    return weights


def deal_rows(jsonl: Path, names: list[str]) -> list[str]:
    """Deal the lines of ``jsonl`` to files ``<name>.jsonl`` beside it in turn (a demo's members);
    return their paths, one per name."""
    lines = jsonl.read_text(encoding="utf-8").splitlines(keepends=True)
    paths = []
    for index, name in enumerate(names):
        member = jsonl.with_name(f"{name}.jsonl")
        member.write_text("".join(lines[index :: len(names)]), encoding="utf-8")
        paths.append(str(member))
    return paths


def inputs_by_member(inputs: list[str], names: list[str]) -> dict[str, list[str]]:
    """Each input under the member its file or folder name starts with (the longest name wins)."""
    grouped: dict[str, list[str]] = {name: [] for name in names}
    unmatched = []
    for item in inputs:
        base = Path(item.rstrip("/")).name
        matches = [n for n in names if base == n or base.startswith((f"{n}.", f"{n}-", f"{n}_"))]
        if not matches:
            unmatched.append(item)
            continue
        grouped[max(matches, key=len)].append(item)
    if unmatched:
        raise ValueError(
            f"inputs {unmatched} belong to no mixture member of {names}; name each input after its "
            "member (math.jsonl, math-2.jsonl, math/ ...)"
        )
    empty = [name for name, items in grouped.items() if not items]
    if empty:
        raise ValueError(f"mixture members {empty} have no input; give an input named after each member")
    return grouped


class MixtureSummary(BaseModel):
    """What a mixture preprocess wrote."""

    output: str
    mixture_file: str
    weights: dict[str, float]
    members: dict[str, Any]  # name -> PreprocessSummary (as a dict)


def write_mixture_file(path: Path, weights: dict[str, float], splits: list[str]) -> Path:
    """The Energon metadataset blending the member folders next to ``path`` by weight."""
    import yaml

    def blend() -> list[dict[str, Any]]:  # a new list per split: YAML aliases would confuse Energon
        return [{"weight": weight, "path": name} for name, weight in weights.items()]

    config = {"__module__": "megatron.energon", "__class__": "MetadatasetV2",
              "splits": {split: {"blend": blend()} for split in splits}}
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def run_mixture_preprocess(config: Any, weights: dict[str, float], ray_address: Optional[str] = None) -> MixtureSummary:
    """Preprocess every member of ``weights`` from ``config.inputs``, write the mixture file, all or nothing."""
    from rl_data.preprocess.pipeline import run_preprocess

    grouped = inputs_by_member(list(config.inputs), list(weights))
    output = Path(config.output)
    if output.exists() and not config.overwrite:
        raise ValueError(f"output {output} already exists; remove it or pass --overwrite")
    staging = output.with_name(f".{output.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    members = {}
    try:
        for name, items in grouped.items():
            member = config.model_copy(update={"inputs": items, "output": str(staging / name), "overwrite": False})
            members[name] = run_preprocess(member, ray_address).model_dump(mode="json")
        splits = [split for split, ratio in config.splits.items() if ratio > 0]
        write_mixture_file(staging / MIXTURE_FILE, weights, splits)
        if output.exists():
            shutil.rmtree(output)
        os.replace(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for summary in members.values():  # the members' summaries name where they were written
        summary["output"] = str(output / Path(summary["output"]).name)
    return MixtureSummary(output=str(output), mixture_file=str(output / MIXTURE_FILE), weights=weights, members=members)
