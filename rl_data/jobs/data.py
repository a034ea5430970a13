"""Step 1 of the main job: the Energon dataset it trains on.

An existing dataset at ``config.dataset_path`` (a folder with ``.nv-meta``) is used as it is.
Otherwise the task's packaged data is written as raw JSONL into the work dir and the Ray Data
preprocessing job (:func:`rl_data.run_preprocess`) turns it into the dataset.
Needs a connected Ray cluster when it preprocesses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from rl_data.jobs.config import TrainDemoConfig
from rl_data.jobs.tasks import sft_demo_task


@dataclass(frozen=True)
class PreparedDataset:
    """Where the dataset is, and the preprocess summary when this run created it."""

    path: str
    preprocess_summary: Optional[Any] = None  # rl_data.preprocess.PreprocessSummary

    @property
    def preprocessed(self) -> bool:
        return self.preprocess_summary is not None


def is_energon_dataset(path: str | Path) -> bool:
    """True for a folder prepared by Energon (it holds ``.nv-meta``)."""
    return (Path(path) / ".nv-meta").is_dir()


def prepare_dataset(config: TrainDemoConfig) -> PreparedDataset:
    """Reuse the dataset at ``config.dataset_path`` or preprocess the task's data into it."""
    from rl_data.preprocess.pipeline import PreprocessConfig, run_preprocess

    path = Path(config.dataset_path)
    if is_energon_dataset(path) or (config.is_mixture and path.is_file()):
        return PreparedDataset(str(path))
    if config.is_mixture and config.mixture is None:
        raise ValueError(f"--data {path} is not a mixture file; pass the mixture.yaml written by `rl-data preprocess --mixture`")
    if path.exists():
        raise ValueError(
            f"--data {path} exists but is not an Energon dataset (no .nv-meta folder); pass a "
            "dataset written by `rl-data preprocess`, or a path that does not exist yet to "
            "preprocess the packaged data into it"
        )
    task = sft_demo_task(config.task)
    raw = Path(config.work_dir) / "raw" / f"{task.name}-{config.num_conversations}.jsonl"
    rows = task.demo.write_raw_rows(raw, config.num_conversations)
    if config.mixture:
        return _prepare_mixture(config, task, raw, rows)
    summary = run_preprocess(
        PreprocessConfig(
            inputs=[str(raw)],
            output=str(path),
            adapter=task.demo.adapter,
            task=task.name,
            tokenizer=config.tokenizer,
            target_shard_rows=max(4, rows // 16),  # ~16 shards: every rank reads several
            splits={"train": 0.8, "val": 0.1, "test": 0.1},
            progress=config.progress,
        )
    )
    return PreparedDataset(str(path), summary)


def _prepare_mixture(config: TrainDemoConfig, task: Any, raw: Path, rows: int) -> PreparedDataset:
    """Deal the raw rows to the mixture members in turn and preprocess them as one mixture."""
    from rl_data.preprocess.mixture import deal_rows, run_mixture_preprocess
    from rl_data.preprocess.pipeline import PreprocessConfig

    names = list(config.mixture)
    inputs = deal_rows(raw, names)
    summary = run_mixture_preprocess(
        PreprocessConfig(
            inputs=inputs, output=str(Path(config.dataset_path).parent), adapter=task.demo.adapter, task=task.name,
            tokenizer=config.tokenizer, target_shard_rows=max(4, rows // (16 * len(names))),
            splits={"train": 0.8, "val": 0.1, "test": 0.1}, progress=config.progress,
        ),
        dict(config.mixture),
    )
    return PreparedDataset(summary.mixture_file, summary)
