"""The main job's summary: what ran, how fast, how well packed, what was skipped, where to look."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from pydantic import BaseModel

from rl_data.jobs.steps import StepRecord


class StepTotals(BaseModel):
    """Totals over step records (every run of the job)."""

    steps: int
    samples: int
    tokens: int
    trained_tokens: int
    #: samples handed out with loss_multiplier 0 (over the sequence length, cut to stubs)
    zero_loss_samples: int
    seconds: float
    packing_efficiency: Optional[float]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class DemoSummary(BaseModel):
    """Everything the job prints at the end (also returned by ``run_demo``)."""

    task: str
    dataset: str
    preprocessed: bool
    ranks: int
    devices: list[str]
    steps_before_checkpoint: int
    checkpoint_step: int
    checkpoint_path: str
    resumed_steps: int
    totals: StepTotals
    skipped_samples: int
    dashboard_url: Optional[str]
    passed: bool
    verdict: str
    reference_ids: list[list[list[Any]]]  # [step after the checkpoint][rank] -> sample ids
    resumed_ids: list[list[list[Any]]]


def count_samples(source_ids: Any) -> int:
    """Samples in one batch's ``source_ids`` (a pack's entry is a list of ids)."""
    return sum(len(ids) if isinstance(ids, list) else 1 for ids in source_ids)


def step_totals(records: Sequence[StepRecord]) -> StepTotals:
    """Sum steps, samples, tokens and time; packing efficiency = real tokens / pack capacity."""
    reports = [report for record in records for report in record.per_rank]
    capacity = sum(int(r["pack_capacity"]) for r in reports)
    tokens = sum(int(r["tokens"]) for r in reports)
    return StepTotals(
        steps=len(records),
        samples=sum(count_samples(r["source_ids"]) for r in reports),
        tokens=tokens,
        trained_tokens=sum(int(r["trained_tokens"]) for r in reports),
        zero_loss_samples=sum(int(r["zero_loss_samples"]) for r in reports),
        seconds=sum(record.seconds for record in records),
        packing_efficiency=tokens / capacity if capacity else None,
    )


#: Share of zero-loss samples above which the summary warns.
ZERO_LOSS_WARNING_SHARE = 0.05


def zero_loss_line(totals: StepTotals) -> str:
    """How many samples trained nothing because they were over length, with advice when many."""
    share = totals.zero_loss_samples / totals.samples if totals.samples else 0.0
    line = f"{totals.zero_loss_samples} of {totals.samples} ({100 * share:.1f}%) over the sequence length, cut, loss 0"
    if share > ZERO_LOSS_WARNING_SHARE:
        line += " - WARNING: that much training signal is lost; raise --seq-len or filter long conversations"
    return line


def summary_lines(summary: DemoSummary) -> list[str]:
    """``label: value`` lines, in the order they are printed."""
    totals = summary.totals
    packing = "off" if totals.packing_efficiency is None else f"{100 * totals.packing_efficiency:.1f}% of pack capacity"
    return [
        f"task: {summary.task}; dataset: {summary.dataset} ({'preprocessed now' if summary.preprocessed else 'existing'})",
        f"ranks: {summary.ranks} (training actors on {', '.join(sorted(set(summary.devices)))})",
        f"steps: {totals.steps} ({summary.steps_before_checkpoint} + {summary.resumed_steps} reference, "
        f"then {summary.resumed_steps} again after the restore)",
        f"samples: {totals.samples}; tokens: {totals.tokens} ({totals.trained_tokens} trained)",
        f"throughput: {totals.tokens_per_s:,.0f} tokens/s over {totals.seconds:.1f} s of steps",
        f"packing efficiency: {packing}",
        f"skipped samples: {summary.skipped_samples}",
        f"zero-loss samples: {zero_loss_line(totals)}",
        f"checkpoint: {summary.checkpoint_path} (step {summary.checkpoint_step})",
        f"dashboard: {summary.dashboard_url or 'not running (start Ray with the dashboard to watch the actors)'}",
        summary.verdict,
    ]


def print_summary(summary: DemoSummary, console: Any) -> None:
    """Print the summary as a small rich table, then the PASS/FAIL line on its own."""
    from rich.table import Table

    table = Table(title="train_sft_demo summary", title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")
    for line in summary_lines(summary)[:-1]:
        label, _, value = line.partition(": ")
        table.add_row(label, value)
    console.print(table)
    style = "bold green" if summary.passed else "bold red"
    console.print(summary.verdict, style=style, markup=False, highlight=False)
