"""The ``preprocess`` command shared by ``rl-data preprocess`` and ``pipelines/preprocess.py``."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Annotated, Optional

import pydantic
import typer

from rl_data.config_blocks import ConfigError
from rl_data.preprocess.mixture import parse_mixture, run_mixture_preprocess
from rl_data.preprocess.pipeline import PreprocessConfig, run_preprocess


def parse_splits(text: str) -> dict[str, float]:
    """``"train=0.8,val=0.1,test=0.1"`` -> ``{"train": 0.8, "val": 0.1, "test": 0.1}``."""
    try:
        return {name.strip(): float(ratio) for name, ratio in (part.split("=") for part in text.split(","))}
    except ValueError:
        raise typer.BadParameter(f"expected NAME=RATIO[,NAME=RATIO...] like 'train=0.8,val=0.1,test=0.1', found {text!r}")


def _cause(error: BaseException) -> BaseException:
    """The error that started it all: the user exception inside Ray's task/Ray Data wrappers."""
    seen = set()
    while id(error) not in seen:
        seen.add(id(error))
        inner = getattr(error, "cause", None) if type(error).__module__.startswith("ray.") else None
        inner = inner or error.__cause__
        if not isinstance(inner, BaseException):
            break
        error = inner
    return error


def _report(error: BaseException) -> None:
    """Print the one-line cause (the message carries the fix) and how to see everything."""
    cause = _cause(error)
    if isinstance(cause, pydantic.ValidationError):
        message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in cause.errors())
    elif isinstance(cause, ConfigError):  # the job's refusal before Ray starts: its problems, numbered when several
        problems = cause.problems
        message = problems[0] if len(problems) == 1 else " ".join(f"({i}) {p}" for i, p in enumerate(problems, 1))
    else:  # Ray Data appends its retry advice to the message on a new line: not the cause
        message = str(cause).split("\nFailed to apply UDF transform", 1)[0]
    message = " ".join(message.split()) or "(no message)"
    typer.echo(f"preprocess failed: {type(cause).__name__}: {message}", err=True)
    typer.echo("(run again with --debug for the full traceback)", err=True)


class _HideErrors(logging.Filter):
    """Hides Ray Data's error records (the failed task's traceback, "please open an issue")
    from the console: Ray Data's console handler drops records marked ``hide``, its log file
    (``ray-data.log`` in the Ray session folder) keeps them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            record.hide = True
        return True


@contextlib.contextmanager
def _quiet_ray_data_errors(enabled: bool) -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _RAY_DATA_ERROR_LOGGERS] if enabled else []
    quiet = _HideErrors()
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)


#: Ray Data loggers that print a failed task's traceback when it aborts the dataset.
_RAY_DATA_ERROR_LOGGERS = ("ray.data._internal.execution.streaming_executor_state", "ray.data.exceptions")


def preprocess(
    inputs: Annotated[list[str], typer.Argument(help="input files, folders, globs or URIs (JSONL, JSON, Parquet)")],
    output: Annotated[str, typer.Option("--output", "-o", help="dataset folder to create")],
    adapter: Annotated[str, typer.Option(help="auto | openai | sharegpt | alpaca | prompt_response | preference | gsm8k | "
                                               "prompt_ground_truth | rl_messages | env_info | pkg.module:function")] = "auto",
    task: Annotated[Optional[str], typer.Option(help="task whose samples to write (chat_sft, vlm_sft, preference, rl_prompt, "
                                                     "pkg.module:TASK): auto-detect among its adapters only")] = None,
    input_format: Annotated[str, typer.Option("--format", help="auto | jsonl | json | parquet")] = "auto",
    tokenizer: Annotated[str, typer.Option(help="'qwen3' or a local tokenizer folder")] = "qwen3",
    max_tokens: Annotated[Optional[int], typer.Option(help="quarantine longer conversations as too_long")] = None,
    target_shard_bytes: Annotated[int, typer.Option(help="cut a shard at about this many bytes")] = 64 * 1024 * 1024,
    target_shard_rows: Annotated[Optional[int], typer.Option(help="cut a shard at this many samples")] = None,
    splits: Annotated[str, typer.Option(help="split ratios, assigned per sample (any input with enough rows for one "
                                             "sample per split works)")] = "train=0.8,val=0.1,test=0.1",
    control_text: Annotated[str, typer.Option(help="text holding a tokenizer control token (e.g. <|im_end|>): 'reject' "
                                                   "quarantines the row; 'plain_text' keeps it, to be encoded as plain "
                                                   "text (the loader needs control_text='plain_text' too)")] = "reject",
    max_failed_rows: Annotated[int, typer.Option(help="the job fails once more rows failed than this and than "
                                                      "--max-failed-fraction of the rows read")] = 100,
    max_failed_fraction: Annotated[float, typer.Option(help="failed share of the rows read that is tolerated "
                                                            "(too_long rows are not failures)")] = 0.01,
    mixture: Annotated[Optional[str], typer.Option(help="write the inputs as the members of a weighted mixture: "
                                                     "NAME=WEIGHT,... (or a YAML {name: weight}); each input "
                                                     "belongs to the member it is named after (math.jsonl, code/); "
                                                     "writes one dataset per member and <output>/mixture.yaml")] = None,
    overwrite: Annotated[bool, typer.Option(help="replace an existing output folder")] = False,
    num_cpus_per_task: Annotated[float, typer.Option(help="CPU share of each transform task (0 < x <= 1)")] = 0.5,
    ray_address: Annotated[Optional[str], typer.Option(help="Ray cluster to use (default: $RAY_ADDRESS or local)")] = None,
    progress: Annotated[bool, typer.Option(help="show progress bars and the summary table")] = True,
    debug: Annotated[bool, typer.Option(help="on failure, show the full traceback instead of the one-line cause")] = False,
) -> None:
    """Convert raw conversation data into an Energon dataset, quarantining rejected rows.

    Inputs, output, task, adapter, tokenizer and splits are checked before Ray starts; a failure
    prints its cause and fix on one line (exit code 1), the full traceback with ``--debug``.
    """
    try:
        config = PreprocessConfig(
            inputs=inputs, output=output, adapter=adapter, task=task, input_format=input_format, tokenizer=tokenizer,
            max_tokens=max_tokens, target_shard_bytes=target_shard_bytes, target_shard_rows=target_shard_rows,
            splits=parse_splits(splits), control_text=control_text, max_failed_rows=max_failed_rows,
            max_failed_fraction=max_failed_fraction, overwrite=overwrite, num_cpus_per_task=num_cpus_per_task,
            progress=progress,
        )
        with _quiet_ray_data_errors(not debug):
            if mixture is None:
                run_preprocess(config, ray_address)
            else:
                summary = run_mixture_preprocess(config, parse_mixture(mixture), ray_address)
                members = ", ".join(f"{name}={w:g} ({summary.members[name]['accepted']} samples)" for name, w in summary.weights.items())
                typer.echo(f"mixture written: {summary.mixture_file} blends {members}")
    except typer.BadParameter:
        raise
    except Exception as error:  # noqa: BLE001 - the command's job is to report it readably
        if debug:
            raise
        _report(error)
        raise typer.Exit(1) from None
