"""The preprocessing job: raw conversation files -> validated samples -> Energon dataset.

Stages (Ray Data, streaming; no stage holds the whole input):

1. read: one task per input file streams ``(file, row, raw)`` blocks (``readers``);
2. transform: parse, adapt, validate, tokenize and encode each row in parallel tasks with
   fractional ``num_cpus`` (``transform``), so reads always find a free CPU slot and a 2-core
   machine cannot deadlock; more cores or nodes run more tasks;
3. write: the driver iterates the results in ``(file, row)`` order (``preserve_order``) and
   writes shards + quarantine into a staged folder (``writer``), then Energon prepares it and
   ``dataset_info.json`` is written; the folder is renamed onto the output only when complete.

Before Ray starts (:func:`check_job`), the job checks what fails in a second and refuses all of it
as one :class:`~rl_data.config_blocks.ConfigError`: an existing output, an unknown task or
adapter, a tokenizer folder that does not exist, missing or empty inputs, and too few rows for
the requested splits.
During the run no single row can end the job: every exception while transforming a row
quarantines it with a reason, and only a failed-rows budget (``max_failed_rows`` /
``max_failed_fraction``, default: more than max(100, 1 % of the rows read) failed) stops it.

The output folder holds ``shards/``, ``.nv-meta/``, ``dataset_info.json`` and
``quarantine.jsonl`` (the rejected rows: ``{file, row, reason, message, raw}``). The quarantine
lives inside the output so it is published atomically with the dataset it belongs to.

Rows may carry media (images, videos, audio) by path or bytes (``preprocess.media``): the
transform loads and checks them, and they travel as bytes in Ray Data blocks to the writer,
which stores them as members of the sample (``energon.sample_format``). Read blocks are cut by
size (``block_bytes``) and shards count media bytes, so large media keep memory bounded.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator

from rl_data.config_blocks import ConfigError
from rl_data.energon.dataset_writer import DEFAULT_SPLITS, min_samples_for_splits
from rl_data.preprocess import adapters, readers, transform, writer
from rl_data.task_registry import get_task
from rl_data.preprocess.validation import RowRejected, parse_row
from rl_data.tokenization.validation import CONTROL_TEXT_POLICIES

_SPLIT_NAMES = ("train", "val", "test")


class PreprocessConfig(BaseModel):
    """Everything the job needs; recorded in ``dataset_info.json``."""

    model_config = ConfigDict(extra="forbid")

    inputs: list[str] = Field(min_length=1, description="Input files, folders, globs or URIs (JSONL, JSON, Parquet).")
    output: str = Field(description="Dataset folder to create (an absolute path for ray job submit).")
    input_format: Literal["auto", "jsonl", "json", "parquet"] = Field(
        "auto", description="Format of the inputs ('auto': from each file's extension)."
    )
    adapter: str = Field("auto", description="'auto' (detected from the first rows), a registered adapter name or "
                         "'pkg.module:function'.")
    task: str | None = Field(None, description="Task whose samples to write ('rl_prompt', 'pkg.module:TASK'): the "
                             "adapter is detected among its adapters and rows of another kind are refused.")
    tokenizer: str = Field("qwen3", description="'qwen3' (the project tokenizer) or a local tokenizer folder.")
    max_tokens: PositiveInt | None = Field(None, description="Quarantine rows longer than this many tokens (too_long).")
    target_shard_bytes: PositiveInt = Field(64 * 1024 * 1024, description="Cut a shard at about this many bytes.")
    target_shard_rows: PositiveInt | None = Field(None, description="Cut a shard at this many samples (None: by bytes only).")
    splits: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_SPLITS),
                                     description="Split ratios ('train', 'val', 'test'), assigned per sample.")
    control_text: Literal[CONTROL_TEXT_POLICIES] = Field(  # type: ignore[valid-type]
        "reject", description="Message text holding a tokenizer control token: quarantine the row ('reject') "
        "or keep it to be encoded as plain text ('plain_text'; the loader needs the same setting).")
    max_failed_rows: int = Field(100, ge=0, description="The job fails once more rows failed than this and than "
                                 "max_failed_fraction of the rows read.")
    max_failed_fraction: float = Field(0.01, ge=0, le=1, description="Failed share of the rows read that is tolerated "
                                       "(too_long rows are not failures).")
    overwrite: bool = Field(False, description="Replace an existing output folder.")
    num_cpus_per_task: float = Field(0.5, gt=0, le=1, description="CPU share of each transform task.")
    batch_size: PositiveInt = Field(256, description="Rows per transform task (lower it for rows with large media).")
    rows_per_block: PositiveInt = Field(1024, description="Rows per read block at most.")
    block_bytes: PositiveInt = Field(readers.BLOCK_BYTES, description="Cut read blocks at about this much row text.")
    raw_chars: PositiveInt = Field(2000, description="Characters of a rejected row's raw text kept in the quarantine file.")
    detect_rows: PositiveInt = Field(100, description="First rows read to detect the adapter.")
    prepare_workers: PositiveInt = Field(2, description="Processes Energon's prepare step uses to index the shards.")
    progress: bool = Field(True, description="Show progress bars and the summary table.")

    @field_validator("splits")
    @classmethod
    def _known_splits(cls, splits: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(splits) - set(_SPLIT_NAMES))
        if unknown or any(v < 0 for v in splits.values()) or not any(v > 0 for v in splits.values()):
            raise ValueError(
                f"splits {splits} must map names in {_SPLIT_NAMES} to ratios >= 0 with at least one > 0"
            )
        return splits

    @field_validator("output")
    @classmethod
    def _absolute_output(cls, output: str) -> str:
        return str(Path(output).expanduser().absolute())


class PreprocessSummary(BaseModel):
    """What the job did (also in ``dataset_info.json``)."""

    output: str
    adapter: str
    read: int
    accepted: int
    quarantined: int
    quarantined_by_reason: dict[str, int]
    duplicates: int
    splits: dict[str, int]
    shards: int
    token_lengths: dict[str, Any]


def connect_ray(address: str | None = None) -> None:
    """Attach to the cluster at ``address`` / ``$RAY_ADDRESS`` (set inside ``ray job submit``),
    else let ``ray.init()`` find a running local cluster or start one. No-op if connected."""
    import ray

    if ray.is_initialized():
        return
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address or "auto")
    else:
        ray.init()


def choose_adapter(config: PreprocessConfig, peeked: list[tuple[readers.InputFile, int, str]]) -> str:
    """The configured adapter, or the one detected from the ``peeked`` first rows."""
    task = get_task(config.task) if config.task is not None else None
    if config.adapter != "auto":
        adapters.resolve_adapter(config.adapter)  # fail fast on the driver
        return config.adapter
    rows = []
    for _, _, raw in peeked:
        with contextlib.suppress(RowRejected):
            rows.append(parse_row(raw))
    if task is not None and not task.adapters:
        raise ValueError(f"task {task.name!r} names no preprocess adapters to detect from; pass --adapter")
    return adapters.detect_adapter(rows, task.adapters if task is not None else None)


def check_job(config: PreprocessConfig) -> tuple[list[readers.InputFile], str]:
    """Everything checkable without Ray, in a second: output, task, adapter, tokenizer, inputs, splits.

    Returns the input files and the adapter name; every problem found is raised as one
    :class:`~rl_data.config_blocks.ConfigError`, each naming the cause and the fix.
    """
    problems = _name_problems(config)
    names_known = not problems
    try:
        writer.refuse_existing_output(config.output, overwrite=config.overwrite)
    except FileExistsError as error:
        problems.append(str(error))
    files, adapter = [], config.adapter
    try:
        files = readers.resolve_inputs(config.inputs, config.input_format)
    except (OSError, ValueError) as error:
        problems.append(str(error))
    if files:
        adapter = _check_rows(config, files, problems, detect=names_known)
    if problems:
        raise ConfigError(f"preprocess to {config.output!r} was not started", problems)
    return files, adapter


def _name_problems(config: PreprocessConfig) -> list[str]:
    """The task, adapter and tokenizer ``config`` names, where they cannot be found."""
    problems = []
    try:
        if config.task is not None:
            get_task(config.task)
    except ValueError as error:
        problems.append(str(error))
    try:
        if config.adapter != "auto":
            adapters.resolve_adapter(config.adapter)
    except ValueError as error:
        problems.append(str(error))
    if config.tokenizer != "qwen3" and not Path(config.tokenizer).is_dir():
        problems.append(
            f"tokenizer {config.tokenizer!r} is neither 'qwen3' nor a local folder; pass a folder holding "
            "tokenizer.json / tokenizer_config.json (hub names cannot be downloaded here)"
        )
    return problems


def _check_rows(config: PreprocessConfig, files: list[readers.InputFile], problems: list[str], *, detect: bool) -> str:
    """Add the problems of the first rows of ``files`` to ``problems`` (too few for the splits, no
    adapter matching them); return the adapter, detected from them when ``detect``."""
    prefixes = {transform.file_key_prefix(f.name): f.name for f in files}
    if len(prefixes) != len(files):
        problems.append("two input file names share a key prefix; rename one of the input files")
    needed = min_samples_for_splits(config.splits)
    try:
        peeked = readers.peek_rows(files, max(config.detect_rows, needed))
    except (OSError, ValueError) as error:
        problems.append(str(error))
        return config.adapter
    if not peeked:
        what = "is empty" if len(files) == 1 else f"are all empty ({len(files)} files)"
        problems.append(f"input {files[0].uri if len(files) == 1 else 'files'} {what}: no row to preprocess; "
                        "check the path, or that the file was written completely")
        return config.adapter
    if len(peeked) < needed:
        problems.append(
            f"the input has only {len(peeked)} row(s), too few for splits {config.splits}: every requested split "
            f"needs a sample, which takes at least {needed} rows; add rows or choose fewer splits (e.g. --splits train=1)"
        )
    try:
        return choose_adapter(config, peeked) if detect else config.adapter
    except ValueError as error:
        problems.append(str(error))
        return config.adapter


def run_preprocess(config: PreprocessConfig, ray_address: str | None = None) -> PreprocessSummary:
    """Check the job (:func:`check_job`), connect to Ray (:func:`connect_ray`) and run it."""
    files, adapter = check_job(config)
    transform.load_tokenizer(config.tokenizer)  # builds the tokenizer cache once, before the workers
    connect_ray(ray_address)
    import ray

    identity_task = ray.remote(num_cpus=0.25)(readers.file_identity)
    identity_refs = [identity_task.remote(f) for f in files]

    with writer.staged_output(config.output, overwrite=config.overwrite) as staging:
        dataset_writer = writer.DatasetWriter(
            staging, target_shard_bytes=config.target_shard_bytes, target_shard_rows=config.target_shard_rows,
            splits=config.splits, budget=writer.FailureBudget(config.max_failed_fraction, config.max_failed_rows),
        )
        with _data_context(progress=config.progress):
            for batch in _progress(_transformed_batches(config, files, adapter), config.progress):
                dataset_writer.add_batch(batch)
        stats = dataset_writer.close()
        info = {"inputs": ray.get(identity_refs), "adapter": adapter, "config": config.model_dump(mode="json"),
                "versions": _versions(), "format": "rl_data.preprocess/1"}
        content = writer.finish_dataset(
            staging, stats, splits=config.splits, prepare_workers=config.prepare_workers, info=info
        )
    summary = PreprocessSummary(
        output=config.output, adapter=adapter, read=stats.read, accepted=stats.accepted,
        quarantined=stats.quarantined, quarantined_by_reason=content["counts"]["quarantined_by_reason"],
        duplicates=stats.duplicates, splits={name: split["samples"] for name, split in content["splits"].items()},
        shards=len(stats.shards), token_lengths=content["token_lengths"],
    )
    if config.progress:
        print_summary(summary)
    return summary


def print_summary(summary: PreprocessSummary) -> None:
    """A rich table of the counts per reason and split."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"preprocess -> {summary.output} (adapter {summary.adapter})")
    table.add_column("what")
    table.add_column("rows", justify="right")
    for what, count in [("read", summary.read), ("accepted", summary.accepted), ("  duplicates (kept)", summary.duplicates),
                        ("quarantined", summary.quarantined)]:
        table.add_row(what, str(count))
    for reason, count in summary.quarantined_by_reason.items():
        table.add_row(f"  quarantined: {reason}", str(count))
    for split, count in summary.splits.items():
        table.add_row(f"  split {split}", str(count))
    table.add_row("shards", str(summary.shards))
    table.add_row("tokens min/mean/p50/p95/max",
                  " / ".join(str(summary.token_lengths[k]) for k in ("min", "mean", "p50", "p95", "max")))
    Console().print(table)


def _transformed_batches(config: PreprocessConfig, files: list[readers.InputFile], adapter: str) -> Iterator[Any]:
    import ray

    items = [{"uri": f.uri, "name": f.name, "format": f.format} for f in files]
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    ds = ds.map_batches(readers.read_rows_batch, batch_size=1, batch_format="numpy", num_cpus=0.25,
                        fn_kwargs={"rows_per_block": config.rows_per_block, "block_bytes": config.block_bytes})
    ds = ds.map_batches(
        transform.transform_batch, batch_size=config.batch_size, batch_format="pyarrow",
        num_cpus=config.num_cpus_per_task,
        fn_kwargs={"adapter": adapters.resolve_adapter(adapter), "tokenizer": config.tokenizer, "max_tokens": config.max_tokens,
                   "raw_chars": config.raw_chars, "folders": {f.name: readers.file_folder(f) for f in files},
                   "control_text": config.control_text, "task": config.task},
    )
    return ds.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=4)


@contextlib.contextmanager
def _data_context(*, progress: bool) -> Iterator[None]:
    """Ray Data with order preserved (deterministic shards) and progress bars on or off."""
    from ray.data import DataContext

    context = DataContext.get_current()
    saved = (context.execution_options.preserve_order, context.enable_progress_bars)
    context.execution_options.preserve_order, context.enable_progress_bars = True, progress
    try:
        yield
    finally:
        context.execution_options.preserve_order, context.enable_progress_bars = saved


def _progress(batches: Iterator[Any], enabled: bool) -> Iterator[Any]:
    from tqdm import tqdm

    with tqdm(desc="writing shards", unit="rows", disable=not enabled) as bar:
        for batch in batches:
            yield batch
            bar.update(batch.num_rows)


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in ("rl_data", "ray", "megatron-energon", "pyarrow", "transformers", "tokenizers"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    return versions


def load_dataset_info(output: str | os.PathLike) -> dict[str, Any]:
    """The ``dataset_info.json`` of a produced dataset."""
    return json.loads((Path(output) / "dataset_info.json").read_text())
