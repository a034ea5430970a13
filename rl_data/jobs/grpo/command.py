"""The ``grpo-demo`` command shared by ``rl-data grpo-demo`` and ``pipelines/grpo_demo.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from rl_data.distributed.config import DEFAULT_NAMESPACE
from rl_data.jobs.grpo.config import DEFAULT_FEED_NAME, DEFAULT_SYSTEM_PROMPT


def grpo_demo(
    data: Annotated[Optional[str], typer.Option(help="prepared rl_prompt Energon dataset (default: generated word problems in --work-dir)")] = None,
    work_dir: Annotated[Path, typer.Option(help="raw prompts, dataset, checkpoints")] = Path("outputs/grpo_demo"),
    num_prompts: Annotated[int, typer.Option(min=8, help="generated word problems (a multiple of ranks x batch size)")] = 96,
    ranks: Annotated[int, typer.Option("--logical-shards", "--ranks", min=1, help="rank actors reading the prompts (the feed's producers)")] = 2,
    dp: Annotated[int, typer.Option(min=1, help="data-parallel trainer ranks")] = 2,
    resume_dp: Annotated[int, typer.Option(min=0, help="trainer ranks after the kill-everything restore (0: --dp)")] = 1,
    batch_size: Annotated[int, typer.Option(min=1, help="prompts per rank-actor batch")] = 4,
    seq_len: Annotated[int, typer.Option(min=16, help="longer prompts are filtered out (counted)")] = 512,
    system_prompt: Annotated[str, typer.Option(help="TaskDataSpec system prompt ('' for none)")] = DEFAULT_SYSTEM_PROMPT,
    workers: Annotated[int, typer.Option(min=1, help="rollout workers")] = 3,
    group_size: Annotated[int, typer.Option(min=2, help="rollouts per prompt")] = 4,
    prompts_per_call: Annotated[int, typer.Option(min=1, help="prompts a worker takes at once")] = 2,
    groups_per_step: Annotated[int, typer.Option(min=1, help="trained groups per step")] = 4,
    max_outstanding: Annotated[int, typer.Option(min=1, help="the feed's window of prompts out at once")] = 24,
    epochs: Annotated[int, typer.Option(min=1, help="run until this many epochs are resolved")] = 3,
    mixture: Annotated[Optional[str], typer.Option(help="deal the prompts to a weighted mixture NAME=WEIGHT,...: one endless epoch, the first --prompts prompts are resolved")] = None,
    prompts: Annotated[Optional[int], typer.Option(min=1, help="with --mixture: prompts to resolve (default --num-prompts x --epochs)")] = None,
    schedule: Annotated[str, typer.Option(help="the feed's schedule: uniform, difficulty_filter, prioritized or package.module:Class")] = "uniform",
    schedule_options: Annotated[Optional[str], typer.Option(help='the schedule\'s options as JSON, e.g. \'{"retire_after": 1}\'')] = None,
    checkpoint_every: Annotated[int, typer.Option(min=1, help="steps between checkpoints")] = 3,
    kill_worker_at_step: Annotated[int, typer.Option(min=0, help="kill a rollout worker after this step (0: never)")] = 4,
    kill_all_at_step: Annotated[int, typer.Option(min=0, help="kill every actor after this step and restore (0: never)")] = 11,
    failure_rate: Annotated[float, typer.Option(min=0, max=0.99, help="chance that a prompt's generation fails")] = 0.05,
    latency_s: Annotated[float, typer.Option(min=0, help="fastest rollout's latency (prompts take 1-12x)")] = 0.01,
    seed: Annotated[int, typer.Option(help="stand-in policy and failures")] = 0,
    namespace: Annotated[str, typer.Option(help="Ray namespace of the named feed")] = DEFAULT_NAMESPACE,
    feed_name: Annotated[str, typer.Option(help="actor name of the prompt feed")] = DEFAULT_FEED_NAME,
    progress: Annotated[bool, typer.Option(help="a line per step")] = True,
) -> None:
    """Async GRPO on the prompt feed with chaos; ends with the accounting table and PASS/FAIL."""
    import json

    from pydantic import ValidationError

    from rl_data.jobs.grpo.config import GRPODemoConfig
    from rl_data.jobs.grpo.demo import run_grpo_demo
    from rl_data.preprocess.mixture import parse_mixture
    from rl_data.prompt_feed.schedules import ScheduleConfig

    try:
        options = json.loads(schedule_options) if schedule_options else {}
        config = GRPODemoConfig(
            data=data, work_dir=str(work_dir), num_prompts=num_prompts, ranks=ranks, dp=dp, resume_dp=resume_dp or None, batch_size=batch_size,
            seq_len=seq_len, system_prompt=system_prompt or None, workers=workers, group_size=group_size,
            prompts_per_call=prompts_per_call, groups_per_step=groups_per_step, max_outstanding=max_outstanding,
            epochs=epochs, mixture=parse_mixture(mixture) if mixture else None, prompts=prompts,
            schedule=ScheduleConfig(name=schedule, options=options), checkpoint_every=checkpoint_every, kill_worker_at_step=kill_worker_at_step or None,
            kill_all_at_step=kill_all_at_step or None, failure_rate=failure_rate, latency_s=latency_s, seed=seed,
            namespace=namespace, feed_name=feed_name, progress=progress,
        )  # fmt: skip
    except (ValidationError, ValueError) as error:
        messages = [e["msg"] for e in error.errors()] if isinstance(error, ValidationError) else [str(error)]
        raise typer.BadParameter("; ".join(messages)) from None
    if not run_grpo_demo(config).passed:
        raise typer.Exit(1)
