"""The ``demo`` command shared by ``rl-data demo`` / ``rl-data run`` and ``pipelines/train_sft_demo.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from rl_data.distributed.config import DEFAULT_NAMESPACE


def train_sft_demo(
    task: Annotated[str, typer.Option(help="task with demo data: chat_sft | vlm_sft (images) | preference (pairs, no packing) | pkg.module:TASK")] = "chat_sft",
    tokenizer: Annotated[str, typer.Option(help="'qwen3' (built offline) or a local tokenizer folder with a chat template (text tasks)")] = "qwen3",
    prompt_file: Annotated[Optional[Path], typer.Option(help="TaskDataSpec prompt: its '{}' takes the first user turn")] = None,
    system_prompt_file: Annotated[Optional[Path], typer.Option(help="TaskDataSpec system prompt, added where a conversation has none")] = None,
    data: Annotated[Optional[str], typer.Option(help="prepared Energon dataset (preprocessed into if missing); default: in --work-dir")] = None,
    work_dir: Annotated[Path, typer.Option(help="raw data, dataset, job_config.json")] = Path("outputs/train_sft_demo"),
    ranks: Annotated[int, typer.Option("--dp", "--ranks", min=1, help="data-parallel ranks (training actors) of run 1")] = 2,
    logical_shards: Annotated[Optional[int], typer.Option(min=1, help="logical data shards G (rank actors), a multiple of --dp and --resume-dp; default: --dp")] = None,
    resume_dp: Annotated[Optional[int], typer.Option(min=1, help="data-parallel ranks of run 2, the resumed run (elastic resume); default: --dp")] = None,
    mixture: Annotated[Optional[str], typer.Option(help="preprocess the task's data as a mixture NAME=WEIGHT,... (rows dealt to the members in turn) and train on it")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="conversations (packs with --packing) per rank per step")] = 4,
    seq_len: Annotated[int, typer.Option(min=16, help="max sequence length (pack capacity with --packing)")] = 4096,
    packing: Annotated[Optional[str], typer.Option(help="packing algorithm, e.g. first_fit_decreasing (default: off)")] = None,
    steps: Annotated[int, typer.Option(min=1, help="steps before the checkpoint")] = 6,
    resume_steps: Annotated[int, typer.Option(min=1, help="steps after the checkpoint, run twice and compared")] = 4,
    checkpoint_dir: Annotated[Optional[Path], typer.Option(help="default: <work-dir>/checkpoint")] = None,
    namespace: Annotated[str, typer.Option(help="Ray namespace of the named coordinator")] = DEFAULT_NAMESPACE,
    prefetch_depth: Annotated[int, typer.Option(min=0, help="batches each rank prepares ahead")] = 2,
    num_conversations: Annotated[int, typer.Option(min=8, help="raw rows (conversations, pictures or pairs) preprocessed into the dataset")] = 256,
    trainer_gpus: Annotated[Optional[float], typer.Option(min=0, help="GPUs per training actor (default: 1 if the cluster has one per rank, else 0)")] = None,
    show_encoding: Annotated[bool, typer.Option(help="print one encoded conversation first")] = True,
    progress: Annotated[bool, typer.Option(help="progress bars")] = True,
) -> None:
    """Preprocess, train on N steps, checkpoint, restart from it and prove the continuation is exact."""
    from pydantic import ValidationError

    from rl_data.jobs.config import TrainDemoConfig
    from rl_data.jobs.sft_demo import run_demo
    from rl_data.preprocess.mixture import parse_mixture

    try:
        config = TrainDemoConfig(
            task=task, tokenizer=tokenizer, data=data,
            prompt_file=None if prompt_file is None else str(prompt_file),
            system_prompt_file=None if system_prompt_file is None else str(system_prompt_file), work_dir=str(work_dir), ranks=ranks, batch_size=batch_size, seq_len=seq_len,
            logical_shards=logical_shards, resume_ranks=resume_dp, mixture=parse_mixture(mixture) if mixture else None,
            packing=packing, steps=steps, resume_steps=resume_steps,
            checkpoint_dir=None if checkpoint_dir is None else str(checkpoint_dir), namespace=namespace,
            prefetch_depth=prefetch_depth, num_conversations=num_conversations, trainer_gpus=trainer_gpus,
            show_encoding=show_encoding, progress=progress,
        )
    except (ValidationError, ValueError) as error:
        messages = [e["msg"] for e in error.errors()] if isinstance(error, ValidationError) else [str(error)]
        raise typer.BadParameter("; ".join(messages)) from None
    summary = run_demo(config)
    if not summary.passed:
        raise typer.Exit(1)
