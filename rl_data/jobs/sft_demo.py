"""``run_demo``: the main job, end to end.

1. connect to Ray (the job's cluster, or a local one), show one encoded conversation;
2. prepare the dataset (preprocess the task's packaged data unless it exists);
3. run 1: start the named coordinator (``ranks`` rank actors) and one training actor per rank,
   run ``steps`` committed steps, save the checkpoint, run ``resume_steps`` more steps and
   record their sample ids (the reference), stop everything;
4. run 2: a fresh coordinator and fresh training actors restore the checkpoint and run the
   same ``resume_steps`` steps; the sample ids per rank per step must equal the reference;
5. return (and print) the summary.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from rich.console import Console

from rl_data.distributed.client import wait_until_name_is_free
from rl_data.distributed.config import LoaderSpec, RuntimeConfig
from rl_data.jobs.config import TrainDemoConfig
from rl_data.jobs.exactness import compare_continuation, compare_global_continuation
from rl_data.jobs.ray_cluster import connect, trainer_gpus
from rl_data.jobs.steps import StepRecord, run_steps
from rl_data.jobs.summary import DemoSummary, print_summary, step_totals

JOB_CONFIG_FILE = "job_config.json"


def run_demo(config: TrainDemoConfig, console: Optional[Console] = None) -> DemoSummary:
    """Run the main job on the connected Ray cluster (or a local one); see the module docstring."""
    from rl_data.jobs.data import prepare_dataset
    from rl_data.jobs.inspect_checkpoint import write_job_config

    console = console or job_console()
    started = time.perf_counter()
    cluster = connect(config)
    console.print(
        f"[bold]train_sft_demo[/bold]: task {config.task}, {config.shards} logical shards x batch {config.batch_size} "
        f"fed to {config.ranks} DP ranks (run 2: {config.dp_of_run(2)}), "
        f"seq len {config.seq_len}, packing {config.packing or 'off'}; Ray with {cluster.cpus:g} CPUs, "
        f"{cluster.gpus:g} GPUs; dashboard {cluster.dashboard_url or 'off'}"
    )
    runtime, spec = config.runtime_config(), config.loader_spec()
    processor = spec.load_processor_factory()()
    if config.show_encoding:
        _show_one_encoding(console, config, processor)
    console.rule("1. dataset")
    dataset = prepare_dataset(config)
    state = "preprocessed now" if dataset.preprocessed else "existing, reused"
    console.print(f"dataset {dataset.path} ({state}) at {time.perf_counter() - started:.1f} s")
    job_file = write_job_config(Path(config.work_dir) / JOB_CONFIG_FILE, runtime, spec)
    gpus = trainer_gpus(config, cluster)
    pad_token_id = getattr(processor, "tokenizer", processor).pad_token_id

    console.rule(f"2. run 1: {config.steps} steps, checkpoint, {config.resume_steps} reference steps")
    with _training_run(config, runtime, spec, gpus, pad_token_id, "run1") as (coordinator, trainers):
        devices = _devices(trainers, config.step_timeout_s)
        console.print(
            f"coordinator {runtime.name!r} in namespace {runtime.namespace!r} ready, trainers on {devices} "
            f"at {time.perf_counter() - started:.1f} s"
        )
        before = _steps(console, config, coordinator, trainers, config.steps, "run 1")
        checkpoint = _save_checkpoint(coordinator, config)
        console.print(f"checkpoint at step {before[-1].step}: {checkpoint}")
        reference = _steps(console, config, coordinator, trainers, config.resume_steps, "run 1, reference")
        skipped = _skipped_samples(coordinator, config.step_timeout_s)

    console.rule(
        f"3. run 2: fresh actors ({config.dp_of_run(2)} DP ranks) restore step {config.steps} and run {config.resume_steps} steps"
    )
    with _training_run(config, config.runtime_config(2), spec, gpus, pad_token_id, "run2") as (coordinator, trainers):
        restored = _load_checkpoint(coordinator, config)
        console.print(f"restored step {restored} from {checkpoint} at {time.perf_counter() - started:.1f} s")
        resumed = _steps(console, config, coordinator, trainers, config.resume_steps, "run 2, resumed")
        skipped += _skipped_samples(coordinator, config.step_timeout_s)

    compare = compare_continuation if config.dp_of_run(2) == config.ranks else compare_global_continuation
    check = compare([(r.step, r.source_ids) for r in reference], [(r.step, r.source_ids) for r in resumed])
    summary = DemoSummary(
        task=config.task,
        dataset=dataset.path,
        preprocessed=dataset.preprocessed,
        ranks=config.ranks,
        devices=devices,
        steps_before_checkpoint=len(before),
        checkpoint_step=restored,
        checkpoint_path=checkpoint,
        resumed_steps=len(resumed),
        totals=step_totals(before + reference + resumed),
        skipped_samples=skipped,
        dashboard_url=cluster.dashboard_url,
        passed=check.passed,
        verdict=check.verdict(),
        reference_ids=[r.source_ids for r in reference],
        resumed_ids=[r.source_ids for r in resumed],
    )
    console.rule(f"summary (job took {time.perf_counter() - started:.1f} s)")
    print_summary(summary, console)
    console.print(f"inspect the checkpoint: rl-data inspect-checkpoint {config.checkpoint_dir} --against {job_file}")
    return summary


def job_console() -> Console:
    """The terminal's console; 160 columns when the output is a log (``ray job logs``, a pipe)."""
    import sys

    return Console() if sys.stdout.isatty() else Console(width=160)


@contextlib.contextmanager
def _training_run(
    config: TrainDemoConfig, runtime: RuntimeConfig, spec: LoaderSpec, gpus: float, pad_token_id: int, label: str
) -> Iterator[tuple[Any, list[Any]]]:
    """A started coordinator + training actors, all stopped (killed) when the block ends."""
    import ray

    from rl_data.distributed.coordinator import start_data_coordinator
    from rl_data.jobs.trainer import start_trainers

    # Training actors start (import torch, build the model) while the rank actors build loaders.
    trainers = start_trainers(
        runtime.parallel_layout.dp, pad_token_id=pad_token_id, num_gpus=gpus, namespace=runtime.namespace, name_prefix=f"{runtime.name}.{label}"
    )
    coordinator = None
    try:
        coordinator = start_data_coordinator(runtime, spec)
        yield coordinator, trainers
    finally:
        if coordinator is not None:
            with contextlib.suppress(Exception):
                ray.get(coordinator.shutdown.remote(), timeout=config.step_timeout_s)
            ray.kill(coordinator, no_restart=True)
        for trainer in trainers:
            ray.kill(trainer, no_restart=True)
        wait_until_name_is_free(runtime.name, runtime.namespace, timeout_s=config.step_timeout_s)


def _steps(console: Console, config: TrainDemoConfig, coordinator: Any, trainers: list[Any], count: int, label: str) -> list[StepRecord]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[info]}"))
    with Progress(*columns, console=console, disable=not config.progress) as progress:
        task = progress.add_task(label, total=count, info="")

        def advance(record: StepRecord) -> None:
            loss = sum(r["loss"] for r in record.per_rank) / len(record.per_rank)
            info = f"step {record.step}: {record.total('tokens')} tokens, loss {loss:.3f}"
            progress.update(task, advance=1, info=info)

        return run_steps(coordinator, trainers, count, timeout_s=config.step_timeout_s, on_step=advance)


def _save_checkpoint(coordinator: Any, config: TrainDemoConfig) -> str:
    import ray

    return ray.get(coordinator.save_checkpoint.remote(config.checkpoint_dir), timeout=config.step_timeout_s)


def _load_checkpoint(coordinator: Any, config: TrainDemoConfig) -> int:
    import ray

    return ray.get(coordinator.load_checkpoint.remote(config.checkpoint_dir), timeout=config.step_timeout_s)


def _devices(trainers: list[Any], timeout_s: float) -> list[str]:
    import ray

    return [info["device"] for info in ray.get([t.describe.remote() for t in trainers], timeout=timeout_s)]


def _skipped_samples(coordinator: Any, timeout_s: float) -> int:
    """Bad samples the rank actors' loaders skipped so far (from the coordinator's status)."""
    import ray

    status = ray.get(coordinator.status.remote(), timeout=timeout_s)
    return sum(int(rank.get("skipped_samples", 0)) for rank in status["ranks"])


def _show_one_encoding(console: Console, config: TrainDemoConfig, processor: Any) -> None:
    from rl_data.jobs.encoding_view import show_conversations

    console.rule("one encoded conversation (trained tokens highlighted)")
    tokenizer = getattr(processor, "tokenizer", processor)
    show_conversations(
        console, tokenizer, num_conversations=1, max_turns=4, max_seq_length=config.seq_len, max_rows=4, examples=False
    )

