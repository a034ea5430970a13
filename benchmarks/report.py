"""Write one run's results as JSON, a Markdown report and a PNG chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COLUMNS = (
    ("samples/s", "samples_per_s", "{:.0f}"),
    ("non-pad tok/s", "non_pad_tokens_per_s", "{:,.0f}"),
    ("steady tok/s", "steady_non_pad_tokens_per_s", "{:,.0f}"),
    ("first batch s", "time_to_first_batch_s", "{:.2f}"),
    ("wait p50 ms", "wait_p50_ms", "{:.2f}"),
    ("wait p99 ms", "wait_p99_ms", "{:.2f}"),
    ("peak mem MB", "peak_memory_mb", "{:.0f}"),
    ("save s", "checkpoint_save_s", "{:.3f}"),
    ("rebuild s", "rebuild_s", "{:.2f}"),
    ("restore s", "checkpoint_restore_s", "{:.3f}"),
    ("replayed", "batches_replayed_on_restore", "{}"),
    ("exact", "restore_exact", "{}"),
    ("non-pad share", "non_pad_share", "{:.3f}"),
)
ROUNDS_KEY = "rounds_non_pad_tokens_per_s"


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "n/a"
    try:
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


def markdown(results: dict[str, Any]) -> str:
    """The Markdown report: contenders table, targets, micro-benchmarks, run conditions."""
    machine = results["machine"]
    lines = [
        "# rl_data benchmark results",
        "",
        f"Run {machine['started']}, {machine['cpus']} CPUs, Python {machine['python']}, "
        f"{machine['duration_s']:.0f} s; load average before {machine['load_avg_before'][0]:.2f}, "
        f"after {machine['load_avg_after'][0]:.2f} (1 min).",
        f"Workload: {json.dumps(results['workload'])}.",
        f"Settings: {json.dumps(results['settings'])}.",
        "",
        "## Contenders",
        "",
        "| contender | " + " | ".join(c[0] for c in COLUMNS) + " | every round, k tok/s | CPU layout |",
        "|---" * (len(COLUMNS) + 3) + "|",
    ]
    for name, figures in results["contenders"].items():
        if "error" in figures:
            lines.append(f"| {name} | failed: {figures['error'][:150]} |" + " |" * (len(COLUMNS) + 1))
            continue
        cells = [_cell(figures.get(key), fmt) for _, key, fmt in COLUMNS]
        rounds = " / ".join("failed" if r is None else f"{r / 1e3:.0f}" for r in figures.get(ROUNDS_KEY, []))
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {rounds} | {figures.get('cpu_layout', '')} |")
    lines += ["", "## Targets", "", "| target | value | required | met | every round |", "|---|---|---|---|---|"]
    for target in results["targets"]:
        value = "n/a" if target["value"] is None else f"{target['value']:.3f}"
        rounds = " / ".join("n/a" if r is None else f"{r:.3f}" for r in target.get("rounds", []))
        lines.append(
            f"| {target['target']} | {value} | {target.get('op', '>=')} {target['required']} | "
            f"{'yes' if target['met'] else 'NO'} | {rounds} |"
        )
    lines += _sweep_tables(results)
    micro = results["micro"]
    chat = micro.get("chat_formatting", {})
    lines += ["", "## Micro-benchmarks", "", "### Chat formatting vs raw encode of the same text", ""]
    if "error" in chat:
        lines.append(f"failed: {chat['error']}")
    elif not chat:
        lines.append("not run")
    else:
        lines += [
            "| path | tokens/s | vs raw |",
            "|---|---|---|",
            f"| raw batch encode (batches of 32) | {chat['raw_batch_encode_tokens_per_s']:,.0f} | 1.00 |",
            f"| raw encode by the Rust backend (`encode_batch_fast`, batches of 32, no transformers layer) | {chat['raw_backend_fast_tokens_per_s']:,.0f} | {chat['raw_backend_fast_tokens_per_s'] / chat['raw_batch_encode_tokens_per_s']:.2f} |",
            f"| raw encode by the project's encoder (`text_encoder`: {chat.get('project_encoder', 'n/a')}), one text per call | {chat.get('raw_project_encoder_tokens_per_s', float('nan')):,.0f} | {chat.get('raw_project_encoder_tokens_per_s', float('nan')) / chat['raw_batch_encode_tokens_per_s']:.2f} |",
            f"| get_formatted_message_log (render once, split) | {chat['formatting_tokens_per_s']:,.0f} | {chat['formatting_vs_raw']:.2f} |",
            f"| reference (render per prefix), {chat['reference_subset_conversations']} convs | {chat['reference_tokens_per_s']:,.0f} | {chat['reference_vs_raw']:.2f} |",
            "",
            f"{chat['conversations']} conversations, {chat['mean_turns']:.1f} turns on average; "
            f"reference ids identical: {chat['reference_ids_identical']}. Formatting per CPU-second "
            f"(`time.process_time`, best round): {chat['formatting_tokens_per_cpu_s']:,.0f} tokens.",
        ]
        truncation = chat.get("truncation")
        if truncation:
            lines += [
                "",
                f"Truncation at {truncation['max_sequence_length']:,} tokens: "
                f"{truncation['over_long_conversations']} conversations reach it, holding "
                f"{truncation['over_long_token_share']:.0%} of the tokens. Formatting with the truncation rule "
                f"(`get_truncated_formatted_message_log`) {truncation['truncated_formatting_cpu_s']:.2f} CPU-s vs "
                f"formatting then truncating {truncation['formatted_then_truncated_cpu_s']:.2f} CPU-s: "
                f"{truncation['speedup']:.2f}x.",
            ]
        families = chat.get("families", {})
        if families:
            lines += ["", "| template family | path | formatting tokens/s | vs raw | reference vs raw | ids identical |",
                      "|---|---|---|---|---|---|"]
            for family, figures in families.items():
                lines.append(
                    f"| {family} | {figures['formatting_path']} | {figures['formatting_tokens_per_s']:,.0f} | "
                    f"{figures['formatting_vs_raw']:.2f} | {figures['reference_vs_raw']:.2f} | "
                    f"{figures['reference_ids_identical']} |"
                )
    lines += ["", "### Packing algorithms", ""]
    packing = micro.get("packing", [])
    if isinstance(packing, dict):
        lines.append(f"failed: {packing.get('error')}")
    else:
        lines += ["| algorithm | sequences/s | ms per buffer | utilisation | bin efficiency | bins |", "|---|---|---|---|---|---|"]
        for row in packing:
            lines.append(
                f"| {row['algorithm']} | {row['sequences_per_s']:,.0f} | {row['ms_per_buffer']:.3f} | "
                f"{row['utilization']:.3f} | {row['bin_efficiency']:.3f} | {row['bins']} |"
            )
    lines += _worker_item_table(micro.get("worker_items", {}))
    lines += _rank_state_table(micro.get("rank_states", {}))
    lines += _deferred_state_table(micro.get("deferred_states", {}))
    lines += _warm_start_table(micro.get("warm_start", {}))
    transfer = micro.get("transfer", {})
    lines += ["", "### 32 MB batch: object store vs in-process copy", ""]
    if "error" in transfer:
        lines.append(f"failed: {transfer['error']}")
    elif transfer:
        lines += ["| path | ms |", "|---|---|"]
        lines += [f"| {key.removesuffix('_ms')} | {value:.1f} |" for key, value in transfer.items() if key.endswith("_ms")]
    return "\n".join(lines) + "\n"


def _micro_table(title: str, figures: dict[str, Any], caption: str, columns: list[tuple[str, Any]]) -> list[str]:
    """A micro-benchmark's heading, caption and table: one row per ``figures`` entry, a column per
    ``(header, cell(key, row))``; its error, or "not run", instead when it has no rows."""
    lines = ["", f"### {title}", ""]
    if "error" in figures:
        return lines + [f"failed: {figures['error']}"]
    if not figures:
        return lines + ["not run"]
    lines += [caption, "", "| " + " | ".join(header for header, _ in columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(cell(key, row) for _, cell in columns) + " |" for key, row in figures.items()]


def _field(name: str, spec: str = "{:.2f}") -> Any:
    return lambda key, row: spec.format(row[name])


def _worker_item_table(figures: dict[str, Any]) -> list[str]:
    return _micro_table(
        "A batch from an Energon worker to its loader: torch's shared memory vs in the message",
        figures,
        "CPU ms per batch (median of rounds); sender: the worker process, receiver: the loader's thread.",
        [
            ("mode", lambda key, row: key),
            ("tensors per batch", _field("tensors_per_batch", "{}")),
            ("sender, shared memory", _field("shared_memory_sender_ms")),
            ("sender, in the message", _field("inline_sender_ms")),
            ("ratio", _field("sender_shared_memory_vs_inline")),
            ("receiver, shared memory", _field("shared_memory_receiver_ms")),
            ("receiver, in the message", _field("inline_receiver_ms")),
            ("ratio", _field("receiver_shared_memory_vs_inline")),
        ],
    )


def _rank_state_table(figures: dict[str, Any]) -> list[str]:
    return _micro_table(
        "A rank's state after every batch with Energon workers: every checkpoint encoded vs only the new one",
        figures,
        "ms per state (median over the batches); the same bytes both ways.",
        [
            ("mode", lambda key, row: key.split("/")[0]),
            ("workers", _field("workers", "{}")),
            ("state bytes", _field("state_bytes", "{:,}")),
            ("every checkpoint", _field("full_ms")),
            ("only the new one", _field("reusing_ms")),
            ("ratio", _field("full_vs_reusing")),
        ],
    )


def _deferred_state_table(figures: dict[str, Any]) -> list[str]:
    return _micro_table(
        "A rank's state after every batch, 0 workers: with the packing buffers' samples vs deferred",
        figures,
        "ms per state (median over the batches); a checkpoint completes its deferred state once.",
        [
            ("mode", lambda key, row: key),
            ("complete bytes", _field("complete_bytes", "{:,}")),
            ("deferred bytes", _field("deferred_bytes", "{:,}")),
            ("complete ms", _field("complete_ms")),
            ("deferred ms", _field("deferred_ms")),
            ("ratio", _field("complete_vs_deferred")),
        ],
    )


def _warm_start_table(figures: dict[str, Any]) -> list[str]:
    from benchmarks.warm_start import table

    lines = ["", "### First step from a fresh Ray session: cold, torch-only and preloaded worker processes", ""]
    if "error" in figures:
        return lines + [f"failed: {figures['error']}"]
    if not figures:
        return lines + ["not run"]
    caption = (
        "`start_data_coordinator` + first `next_step` + fetch, from the driver, unpacked; Ray's "
        "`preload_python_modules`: nothing / torch (d's footing) / `rl_data.distributed.preload`. "
        "`warm ranks`: rank actors that got a prestarted worker (Ray prestarts about one per core)."
    )
    return lines + [caption, ""] + table(figures)


def _ratio(value: Any) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _sweep_tables(results: dict[str, Any]) -> list[str]:
    """Worker sweep, VLM and per-CPU tables (empty where the run had none)."""
    lines: list[str] = []
    sweep = results.get("worker_sweep") or []
    if sweep:
        lines += [
            "",
            "## Workers per rank (1 rank actor vs StatefulDataLoader, same worker count)",
            "",
            f"{results['settings'].get('sweep_samples_per_run')} samples per run, "
            f"{results['settings'].get('sweep_rounds')} round(s); non-pad tokens/s end to end. "
            "b's rank actor reserves min(max(1, workers), parallelism) CPUs; d with 0 workers loads in its process.",
            "",
            "| mode | workers | b rank CPUs | b tok/s | d tok/s | b / d | b vs b(0 workers) | d vs d(0 workers) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in sweep:
            cells = [_cell(row["b_non_pad_tokens_per_s"], "{:,.0f}"), _cell(row["d_non_pad_tokens_per_s"], "{:,.0f}")]
            lines.append(
                f"| {row['mode']} | {row['workers']} | {row['b_rank_cpus']:g} | {cells[0]} | {cells[1]} | "
                f"{_ratio(row['b_over_d'])} | {_ratio(row['b_over_b_w0'])} | {_ratio(row['d_over_d_w0'])} |"
            )
    vlm = results.get("vlm") or []
    if vlm:
        described = results.get("vlm_workload") or {}
        lines += [
            "",
            "## VLM (vlm_sft: JPEG decode + Qwen2-VL image processor + chat formatting)",
            "",
            f"Workload: {json.dumps(described)}.",
            "",
            "| contender | workers | samples/s (= images/s) | non-pad tok/s | first batch s | vs 0 workers |",
            "|---|---|---|---|---|---|",
        ]
        for row in vlm:
            lines.append(
                f"| {row['contender']} | {row['workers']} | {_cell(row['samples_per_s'], '{:.1f}')} | "
                f"{_cell(row['non_pad_tokens_per_s'], '{:,.0f}')} | {_cell(row['time_to_first_batch_s'], '{:.2f}')} | "
                f"{_ratio(row['vs_w0'])} |"
            )
    chat = results.get("micro", {}).get("chat_formatting", {})
    per_cpu = [
        (name, figures) for name, figures in results["contenders"].items() if "steady_non_pad_tokens_per_cpu_s" in figures
    ]
    if per_cpu:
        lines += [
            "",
            "## Per CPU-second (one process, 0 workers)",
            "",
            "| contender | steady non-pad tok/s | CPU s (first to last batch) | tokens per CPU-s | vs chat formatting alone |",
            "|---|---|---|---|---|",
        ]
        formatting = chat.get("formatting_tokens_per_cpu_s")
        for name, figures in per_cpu:
            rate = figures["steady_non_pad_tokens_per_cpu_s"]
            lines.append(
                f"| {name} | {figures['steady_non_pad_tokens_per_s']:,.0f} | {figures['steady_cpu_s']:.1f} | {rate:,.0f} | "
                f"{_ratio(rate / formatting if formatting else None)} |"
            )
        if formatting:
            lines.append(f"| chat formatting alone (micro) | | | {formatting:,.0f} | 1.00 |")
    return lines


def chart(results: dict[str, Any], path: Path) -> None:
    """Bar chart: non-pad tokens/s per contender, unpacked and packed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = ("unpacked", "packed")
    names = sorted({name.split("/")[0] for name in results["contenders"] if name.split("/")[-1] in modes})
    figure, axis = plt.subplots(figsize=(max(10, 0.8 * len(names)), 4.5))
    width = 0.4
    for offset, mode in ((-width / 2, "unpacked"), (width / 2, "packed")):
        values = [results["contenders"].get(f"{n}/{mode}", {}).get("non_pad_tokens_per_s") or 0 for n in names]
        axis.bar([i + offset for i in range(len(names))], values, width, label=mode)
    axis.set_xticks(range(len(names)), names, rotation=20, ha="right")
    axis.set_ylabel("non-pad tokens / s")
    axis.set_title(f"Throughput on {results['machine']['cpus']} CPUs (higher is better)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_reports(results: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """``results.json``, ``results.md`` and ``throughput.png`` in ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "markdown": out / "results.md", "chart": out / "throughput.png"}
    paths["json"].write_text(json.dumps(results, indent=2, sort_keys=True, allow_nan=False) + "\n")
    paths["markdown"].write_text(markdown(results))
    chart(results, paths["chart"])
    return paths
