"""The ``preprocess`` command shared by ``rl-data preprocess`` and ``pipelines/preprocess.py``."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from rl_data.preprocess.pipeline import PreprocessConfig, connect_ray, run_preprocess


def parse_splits(text: str) -> dict[str, float]:
    """``"train=0.8,val=0.1,test=0.1"`` -> ``{"train": 0.8, "val": 0.1, "test": 0.1}``."""
    try:
        return {name.strip(): float(ratio) for name, ratio in (part.split("=") for part in text.split(","))}
    except ValueError:
        raise typer.BadParameter(f"expected NAME=RATIO[,NAME=RATIO...] like 'train=0.8,val=0.1,test=0.1', found {text!r}")


def preprocess(
    inputs: Annotated[list[str], typer.Argument(help="input files, folders, globs or URIs (JSONL, JSON, Parquet)")],
    output: Annotated[str, typer.Option("--output", "-o", help="dataset folder to create")],
    adapter: Annotated[str, typer.Option(help="auto | openai | sharegpt | alpaca | prompt_response | preference | pkg.module:function")] = "auto",
    input_format: Annotated[str, typer.Option("--format", help="auto | jsonl | json | parquet")] = "auto",
    tokenizer: Annotated[str, typer.Option(help="'qwen3' or a local tokenizer folder")] = "qwen3",
    max_tokens: Annotated[Optional[int], typer.Option(help="quarantine longer conversations as too_long")] = None,
    target_shard_bytes: Annotated[int, typer.Option(help="cut a shard at about this many bytes")] = 64 * 1024 * 1024,
    target_shard_rows: Annotated[Optional[int], typer.Option(help="cut a shard at this many samples")] = None,
    splits: Annotated[str, typer.Option(help="split ratios by shard")] = "train=0.8,val=0.1,test=0.1",
    overwrite: Annotated[bool, typer.Option(help="replace an existing output folder")] = False,
    num_cpus_per_task: Annotated[float, typer.Option(help="CPU share of each transform task (0 < x <= 1)")] = 0.5,
    ray_address: Annotated[Optional[str], typer.Option(help="Ray cluster to use (default: $RAY_ADDRESS or local)")] = None,
    progress: Annotated[bool, typer.Option(help="show progress bars and the summary table")] = True,
) -> None:
    """Convert raw conversation data into an Energon dataset, quarantining rejected rows."""
    config = PreprocessConfig(
        inputs=inputs, output=output, adapter=adapter, input_format=input_format, tokenizer=tokenizer,
        max_tokens=max_tokens, target_shard_bytes=target_shard_bytes, target_shard_rows=target_shard_rows,
        splits=parse_splits(splits), overwrite=overwrite, num_cpus_per_task=num_cpus_per_task, progress=progress,
    )
    connect_ray(ray_address)
    run_preprocess(config)
