"""Draw the performance page's plots from figures recorded in ``benchmarks/RESULTS.md``.

The figures below are copied from RESULTS.md, each with the section it comes from; nothing is
measured here. Re-run after a new benchmark run changes one of them:

    .venv/bin/python -m benchmarks.plot_headlines            # writes docs/performance/*.svg

Needs matplotlib (the ``bench`` extra). The SVG files are deterministic (no date, fixed ids), so
an unchanged figure leaves its file unchanged.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "docs" / "performance"

# --- the figures, by RESULTS.md section ---------------------------------------------------------

#: "Run 10 (tables)", "Chat formatting vs raw encode of the same text": tokens/s, one process.
TOKENIZATION = {
    "tokenizer call,\nbatches of 32": 581_631,
    "Rust backend\nencode_batch_fast": 709_520,
    "rl_data encoder\n(tiktoken)": 4_289_497,
    "chat formatting\n(get_formatted_message_log)": 1_575_859,
}

#: "In-place rewind vs a new coordinator": seconds to the first step's batches after the restore.
REWIND = {  # (ranks, packed): (rewind of the live coordinator, kill + new coordinator + restore)
    ("2 ranks", "unpacked"): (0.05, 4.48),
    ("2 ranks", "packed"): (0.08, 4.51),
    ("4 ranks", "unpacked"): (0.09, 8.20),
    ("4 ranks", "packed"): (0.16, 8.30),
}

#: "2026-12-05: warm Ray workers, ...", the 3-repeat table: first step from a fresh Ray session,
#: 1 rank, seconds (medians); d = StatefulDataLoader with 2 workers in a fresh process.
WARM_START = {"unpacked": (3.13, 2.00, 1.18), "packed": (3.16, 2.42, 1.31)}
WARM_START_D = 1.81

#: "Run 10 (tables)", "A batch from an Energon worker to its loader": CPU ms per batch.
WORKER_ITEMS = {  # mode: (sender shared memory, sender in the message, receiver shm, receiver in the message)
    "unpacked": (1.71, 0.83, 0.85, 0.93),
    "packed": (2.54, 1.40, 1.54, 1.37),
}

#: "Scale on a quiet machine, with bare-Ray floors": coordinator CPU ms per step.
SCALE_SHARDS = (8, 32, 128)
SCALE_COORDINATOR = (14.8, 30.6, 135.7)
SCALE_BARE_RAY = (12.9, 29.8, 133.5)

#: Same section, "Feed": take p50 ms, take(4) + ack per round.
FEED_CALLERS = (1, 16, 64, 256)
FEED_CLOSED_LOOP = (3.8, 32.6, 137.0, 408.7)
FEED_BARE_RAY = (2.2, 16.5, 63.1, 264.1)
FEED_PACED = (7.0, 10.9, 8.8, 7.7)

# --- the plots --------------------------------------------------------------------------------

BLUE, GREY, ORANGE = "#2f6eb5", "#9aa0a6", "#e07b39"


def plain_log_ticks(axis, ticks: tuple[float, ...]) -> None:
    """A log axis labelled with plain numbers at ``ticks``."""
    axis.set_ticks(ticks, [f"{t:g}" for t in ticks])
    from matplotlib.ticker import NullLocator

    axis.set_minor_locator(NullLocator())


def tokenization(plt) -> object:
    figure, axes = plt.subplots(figsize=(7, 2.8))
    names, rates = list(TOKENIZATION), [v / 1e6 for v in TOKENIZATION.values()]
    colors = [GREY, GREY, BLUE, BLUE]
    axes.barh(names[::-1], rates[::-1], color=colors[::-1])
    for y, rate in enumerate(rates[::-1]):
        axes.text(rate + 0.05, y, f"{rate:.2f} M", va="center", fontsize=9)
    axes.set_xlabel("million tokens per second, one process (higher is better)")
    axes.set_xlim(0, max(rates) * 1.18)
    axes.set_title("Tokenization: the same ids, through tiktoken")
    return figure


def rewind(plt) -> object:
    figure, axes = plt.subplots(figsize=(7, 3))
    labels = [f"{ranks}\n{mode}" for ranks, mode in REWIND]
    positions = range(len(labels))
    live = [v[0] for v in REWIND.values()]
    rebuilt = [v[1] for v in REWIND.values()]
    axes.bar([p - 0.2 for p in positions], live, width=0.4, color=BLUE, label="rewind the live coordinator")
    axes.bar([p + 0.2 for p in positions], rebuilt, width=0.4, color=GREY, label="kill it, start a new one, restore")
    for position, value in zip(positions, live):
        axes.text(position - 0.2, value * 1.15, f"{value:.2f}", ha="center", fontsize=8)
    for position, value in zip(positions, rebuilt):
        axes.text(position + 0.2, value * 1.15, f"{value:.1f}", ha="center", fontsize=8)
    axes.set_yscale("log")
    axes.set_ylim(0.02, 20)
    plain_log_ticks(axes.yaxis, (0.05, 0.1, 0.5, 1, 5, 10))
    axes.set_xticks(list(positions), labels)
    axes.set_ylabel("seconds to the first step (log)")
    axes.set_title("Restoring a checkpoint: in place vs a new coordinator")
    axes.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2, frameon=False)
    return figure


def warm_start(plt) -> object:
    figure, axes = plt.subplots(figsize=(7, 3))
    variants = ("cold workers", "torch preloaded", "rl_data preloaded")
    modes = list(WARM_START)
    for index, mode in enumerate(modes):
        values = WARM_START[mode]
        xs = [i + (index - 0.5) * 0.38 for i in range(len(variants))]
        axes.bar(xs, values, width=0.38, color=[GREY, GREY, BLUE], alpha=1.0 if index == 0 else 0.6,
                 edgecolor="white")
        for x, value in zip(xs, values):
            axes.text(x, value + 0.05, f"{value:.2f}", ha="center", fontsize=8)
            axes.text(x, 0.08, mode, ha="center", fontsize=7, color="white", rotation=90, va="bottom")
    axes.axhline(WARM_START_D, color=ORANGE, linestyle="--", linewidth=1)
    axes.text(2.45, WARM_START_D + 0.06, "StatefulDataLoader\n(2 workers)", color=ORANGE, fontsize=8, ha="right")
    axes.set_xticks(range(len(variants)), variants)
    axes.set_ylabel("seconds to the first step")
    axes.set_title("First step from a fresh Ray session, one rank actor")
    return figure


def worker_items(plt) -> object:
    figure, panels = plt.subplots(1, 2, figsize=(7, 2.8), sharey=True)
    for panel, side, offset in ((panels[0], "worker (sender)", 0), (panels[1], "rank (receiver)", 2)):
        modes = list(WORKER_ITEMS)
        shared = [WORKER_ITEMS[m][offset] for m in modes]
        inline = [WORKER_ITEMS[m][offset + 1] for m in modes]
        panel.bar([i - 0.2 for i in range(2)], shared, width=0.4, color=GREY, label="torch: shared memory per tensor")
        panel.bar([i + 0.2 for i in range(2)], inline, width=0.4, color=BLUE, label="rl_data: inside the message")
        panel.set_xticks(range(2), modes)
        panel.set_title(side, fontsize=10)
    panels[0].set_ylabel("CPU ms per batch")
    panels[0].set_ylim(0, 3.6)
    panels[0].legend(fontsize=7, loc="upper left")
    figure.suptitle("A text batch from an Energon worker to its rank", fontsize=11)
    return figure


def scale(plt) -> object:
    figure, axes = plt.subplots(figsize=(7, 3))
    axes.plot(SCALE_SHARDS, SCALE_COORDINATOR, "o-", color=BLUE, label="rl_data coordinator")
    axes.plot(SCALE_SHARDS, SCALE_BARE_RAY, "s--", color=GREY, label="bare Ray: one call per rank (floor)")
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    plain_log_ticks(axes.yaxis, (10, 20, 50, 100, 150))
    axes.set_xticks(SCALE_SHARDS, [str(g) for g in SCALE_SHARDS])
    axes.set_xlabel("logical shards G (rank actors), one 2-core machine")
    axes.set_ylabel("coordinator CPU ms per step")
    axes.set_title("Coordinator cost per step: at Ray's own cost per call")
    axes.legend(fontsize=8)
    return figure


def feed(plt) -> object:
    figure, axes = plt.subplots(figsize=(7, 3))
    axes.plot(FEED_CALLERS, FEED_CLOSED_LOOP, "o-", color=BLUE, label="feed, closed loop (no pause)")
    axes.plot(FEED_CALLERS, FEED_BARE_RAY, "s--", color=GREY, label="bare Ray actor, closed loop (floor)")
    axes.plot(FEED_CALLERS, FEED_PACED, "^-", color=ORANGE, label="feed, a round every 1-3 s per caller")
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    plain_log_ticks(axes.yaxis, (2, 5, 10, 20, 50, 100, 200, 500))
    axes.set_xticks(FEED_CALLERS, [str(c) for c in FEED_CALLERS])
    axes.set_xlabel("concurrent callers, each take(4) then ack")
    axes.set_ylabel("take latency p50, ms")
    axes.set_title("Prompt feed: take latency by number of callers")
    axes.legend(fontsize=8)
    return figure


PLOTS: dict[str, Callable[..., object]] = {
    "tokenization": tokenization,
    "rewind": rewind,
    "warm_start": warm_start,
    "worker_items": worker_items,
    "scale_coordinator": scale,
    "scale_feed": feed,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT})")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "rl_data", "svg.fonttype": "none", "font.size": 9,
                         "axes.spines.top": False, "axes.spines.right": False})
    args.out.mkdir(parents=True, exist_ok=True)
    for name, draw in PLOTS.items():
        figure = draw(plt)
        figure.tight_layout()
        path = args.out / f"{name}.svg"
        figure.savefig(path, metadata={"Date": None})
        plt.close(figure)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
