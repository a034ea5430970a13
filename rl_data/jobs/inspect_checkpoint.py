"""Inspect a data coordinator checkpoint, and check whether a job configuration would restore it.

A *job config file* (YAML or JSON) holds what a job hands the runtime:
``{"runtime": <RuntimeConfig fields>, "loader": <LoaderSpec fields>}``; the main job writes
its own to ``<work_dir>/job_config.json``. :func:`refusal_lines` computes, without Ray, what
``DataCoordinator.load_state_dict`` would compare: the placement layout of the config, the
number of ranks, and per rank the identity of the loader the rank actor would build (built
here the same way, with the same processor factory and placement fingerprint).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from rl_data.distributed.checkpoint_files import checkpoint_path, load_checkpoint_file
from rl_data.distributed.config import LoaderSpec, RuntimeConfig


class JobConfigFile(BaseModel):
    """The runtime and loader configuration a job runs with."""

    model_config = ConfigDict(extra="forbid")

    runtime: RuntimeConfig
    loader: LoaderSpec


def write_job_config(path: str | Path, runtime: RuntimeConfig, loader: LoaderSpec) -> Path:
    """Write a job config file (JSON) for ``rl-data inspect-checkpoint --against``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(JobConfigFile(runtime=runtime, loader=loader).model_dump_json(indent=2) + "\n")
    return path


def load_job_config(path: str | Path) -> JobConfigFile:
    """Read a job config file; ``.json`` is JSON, anything else YAML."""
    import yaml

    text = Path(path).read_text(encoding="utf-8")
    data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    return JobConfigFile.model_validate(data)


def read_checkpoint(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """``(file, content)`` of a checkpoint given its directory or its file."""
    path = Path(path)
    file = path if path.is_file() else checkpoint_path(path)
    return file, load_checkpoint_file(file)


def describe_checkpoint(file: Path, content: dict[str, Any]) -> list[str]:
    """Step, placement fingerprint and layout, ranks with their identity fingerprints, rank 0's identity."""
    from rl_data.fingerprint import fingerprint

    ranks = content["ranks"]
    lines = [
        f"checkpoint: {file}",
        f"format: {content['format']} v{content['format_version']}",
        f"step: {content['step']}",
        f"ranks: {len(ranks)}",
        f"placement fingerprint: {content['placement']['fingerprint']}",
        f"placement layout: {json.dumps(content['placement']['layout'], sort_keys=True)}",
        f"consumer layout when saved: {json.dumps(content.get('consumer_layout'), sort_keys=True)} "
        f"(restores at any dp dividing {len(content['ranks'])})",
    ]
    members = ranks[0]["identity"].get("mixture") if ranks else None
    if members:
        lines.append("mixture: " + ", ".join(
            f"{name}={m['weight']:g} ({m['path']})" if "weight" in m else f"{name} ({m['path']})" for name, m in members.items()
        ))
    for rank, state in enumerate(ranks):
        topology = state["identity"]["topology"]
        lines.append(
            f"rank {rank}: identity fingerprint {fingerprint(state['identity'])} "
            f"(logical rank {topology['logical_rank']} of {topology['logical_world_size']})"
        )
        if state.get("mixture"):
            lines.append(f"rank {rank} mixture: {mixture_line(state['mixture'])}")
    if ranks:
        lines.append("identity (rank 0):")
        lines.extend("  " + line for line in json.dumps(ranks[0]["identity"], indent=2, sort_keys=True).splitlines())
    return lines


def mixture_line(record: dict[str, Any]) -> str:
    """``N batches; samples a 12, b 8; weights a=0.5 b=0.5 from batch 0, a=0.2 b=0.8 from batch 30``."""
    samples = ", ".join(f"{name} {count}" for name, count in record["counts"].items())
    weights = ", ".join(
        " ".join(f"{name}={w:g}" for name, w in entry["weights"].items()) + f" from batch {entry['batches']}"
        for entry in record["history"]
    )
    return f"{record['batches']} batches; samples {samples}; weights {weights}"


def refusal_lines(content: dict[str, Any], job: JobConfigFile) -> list[str]:
    """Every difference that makes a coordinator with ``job``'s config refuse the checkpoint ([] = restores)."""
    from rl_data.distributed.placement import config_layout, placement_fingerprint
    from rl_data.energon.identity import restore_differences
    from rl_data.fingerprint import differences

    layout = config_layout(job.runtime)
    lines = [f"placement layout: {line}" for line in differences(content["placement"]["layout"], layout)]
    saved_ranks = content["ranks"]
    world = job.runtime.world_size
    if len(saved_ranks) != world:
        lines.append(f"ranks: the checkpoint holds {len(saved_ranks)} rank states, the config runs {world} ranks")
    current = loader_identities(job.loader, world, placement_fingerprint(layout))
    for rank, (saved, identity) in enumerate(zip(saved_ranks, current)):
        lines.extend(f"rank {rank} identity: {line}" for line in restore_differences(saved.get("identity"), identity))
    return lines


def loader_identities(spec: LoaderSpec, world_size: int, fingerprint: str) -> list[dict[str, Any]]:
    """The identity of each rank's loader, built exactly as a rank actor builds it."""
    from rl_data.energon.sft_dataloader import build_energon_sft_loader

    processor = spec.load_processor_factory()()
    identities = []
    for rank in range(world_size):
        loader = build_energon_sft_loader(
            **spec.builder_kwargs(),
            processor=processor,
            logical_rank=rank,
            logical_world_size=world_size,
            placement_fingerprint=fingerprint,
        )
        identities.append(loader.identity)
        loader.close()
    return identities
