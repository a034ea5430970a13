"""Smoke test of the benchmark suite: ``python -m benchmarks --quick`` runs and writes well-formed reports.

Timings are not asserted (they depend on the machine); the structure, the contenders and the
correctness facts the suite checks itself (exact restores, identical reference ids) are.
Runs in a subprocess: the suite starts its own private Ray instance.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_benchmark(module: str, *args: str, timeout: float) -> None:
    """``python -m <module> <args>`` from the repository root (Ray's usage stats off); it must exit 0."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    completed = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert completed.returncode == 0, completed.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(930)
def test_quick_benchmark_writes_json_markdown_and_png(tmp_path):
    # ~2.5 min alone on 2 cores; a loaded CI machine takes much longer
    run_benchmark("benchmarks", "--quick", "--out", str(tmp_path), timeout=900)
    results = json.loads((tmp_path / "results.json").read_text())

    contenders = results["contenders"]
    # quick runs a code path once (BenchSettings.quick): b_rl_data_1rank_w2 is both the worker
    # sweep's b and the restore contender with Energon workers; VLM at 2 workers only
    sweep = ["b_rl_data_1rank_w2/packed", "d_torchdata_w2/packed"]
    vlm = ["b_rl_data_1rank_w2/vlm", "d_torchdata_w2/vlm"]
    restored = ["a_energon_bare/packed", "b_rl_data_1rank/packed", "b_rl_data_1rank_w2/packed", "c_ray_data/packed", "d_torchdata/packed"]
    assert sorted(contenders) == sorted(set(restored + sweep + vlm))
    settings = results["settings"]
    for name, figures in contenders.items():
        assert "error" not in figures, (name, figures.get("traceback"))
        for key in ("samples_per_s", "non_pad_tokens_per_s", "time_to_first_batch_s", "wait_p50_ms", "wait_p99_ms"):
            assert math.isfinite(figures[key]) and figures[key] >= 0, (name, key, figures[key])
        expected = settings["samples_per_run"]
        if name in sweep:
            expected = settings["sweep_samples_per_run"]
        elif name in vlm:
            expected = settings["vlm_samples_per_run"]
        assert figures["samples"] >= expected, name
        assert 0 < figures["non_pad_share"] <= 1, name
        assert figures["rounds_non_pad_tokens_per_s"] == [figures["non_pad_tokens_per_s"]], name  # 1 round
        if name in restored:
            assert math.isfinite(figures["checkpoint_restore_s"]) and figures["checkpoint_restore_s"] >= 0, name
            assert figures["restore_exact"] is True, name
        else:  # the sweep runs measure throughput only
            assert "checkpoint_restore_s" not in figures, name
    assert contenders["b_rl_data_1rank_w2/packed"]["batches_replayed_on_restore"] == 0  # restore with Energon workers
    assert contenders["a_energon_bare/packed"]["steady_non_pad_tokens_per_cpu_s"] > 0
    assert [(row["mode"], row["workers"]) for row in results["worker_sweep"]] == [("packed", 2)]
    assert results["worker_sweep"][0]["b_over_d"] > 0
    assert [row["contender"] for row in results["vlm"]] == sorted(vlm)
    assert all(row["images_per_s"] > 0 for row in results["vlm"])
    assert contenders["c_ray_data/packed"]["batches_replayed_on_restore"] >= 1
    assert contenders["b_rl_data_1rank/packed"]["batches_replayed_on_restore"] == 0
    assert contenders["c_ray_data/packed"]["checkpoint_save_s"] is None

    micro = results["micro"]
    assert micro["chat_formatting"]["reference_ids_identical"] is True
    assert micro["chat_formatting"]["tokens"] == micro["chat_formatting"]["raw_tokens_same_text"]
    assert [row["algorithm"] for row in micro["packing"]] == [
        "concatenative",
        "first_fit_decreasing",
        "first_fit_shuffle",
        "modified_first_fit_decreasing",
        "greedy_knapsack",
        "balanced_greedy_knapsack",
    ]
    assert all(0 < row["utilization"] <= 1 for row in micro["packing"])
    items = micro["worker_items"]["packed"]
    assert items["batches"] == 4 and items["tensors_per_batch"] >= 4
    assert all(items[f"{way}_{side}_ms"] > 0 for way in ("shared_memory", "inline") for side in ("sender", "receiver"))
    states = micro["rank_states"]["packed/2"]
    assert (states["workers"], states["batches"]) == (2, 4) and states["state_bytes"] > 0
    assert states["full_ms"] > 0 and states["reusing_ms"] > 0
    deferred = micro["deferred_states"]["packed"]
    assert deferred["batches"] == 4 and 0 < deferred["deferred_bytes"] < deferred["complete_bytes"]
    assert deferred["complete_ms"] > 0 and deferred["deferred_ms"] > 0
    assert set(micro["transfer"]) == {"bytes", "in_process_clone_ms", "object_store_batched_data_dict_ms", "object_store_dict_of_torch_ms"}
    warm = micro["warm_start"]
    assert sorted(warm["b"]) == ["2/preload"] and warm["d_first_batch_s"] > 0
    assert all(row["first_step_s"] > 0 and row["warm_ranks"] in ([0], [1], [2]) for row in warm["b"].values())
    judged = {t["target"]: t for t in results["targets"]}
    assert set(judged) >= {
        "chat formatting / raw encode of the same text (issue 7)",
        "b(1 rank) / a in every round, packed",
        "b(1rank) time to first batch / d's, packed",
        "a's steady tokens per CPU-second / chat formatting's alone, packed",
        "b(1 rank, 0 Energon workers each) restore < 1 s with no replayed batch, packed",
        "b(1 rank, 2 Energon workers each) restore < 1 s with no replayed batch, packed",
        "VLM rank actor, 2 Energon workers / 0 workers, samples (images) per s",
    }
    assert judged["b(1 rank) / a in every round, packed"]["rounds"] == [judged["b(1 rank) / a in every round, packed"]["value"]]
    unjudged = "VLM rank actor, 2 Energon workers / 0 workers, samples (images) per s"  # quick runs VLM at 2 only
    for name, target in judged.items():  # every target the quick run can judge has a value
        assert (target["value"] is None) == (name == unjudged), target

    markdown = (tmp_path / "results.md").read_text()
    assert markdown.startswith("# rl_data benchmark results\n")
    for heading in (
        "## Contenders", "## Targets", "## Workers per rank", "## VLM", "## Per CPU-second",
        "### Chat formatting vs raw encode of the same text", "### Packing algorithms", "### 32 MB batch",
        "### First step from a fresh Ray session",
    ):  # fmt: skip
        assert heading in markdown
    header = next(line for line in markdown.splitlines() if line.startswith("| contender |"))
    section = markdown.split("## Contenders", 1)[1].split("\n## ", 1)[0]  # other tables name contenders too
    rows = [line for line in section.splitlines() if line.startswith("| a_energon_bare/packed |")]
    assert len(rows) == 1 and rows[0].count("|") == header.count("|")
    assert (tmp_path / "throughput.png").read_bytes()[:8] == PNG_SIGNATURE


def test_each_contender_keeps_its_fastest_round_and_every_rate():
    from benchmarks.suite import _keep_best

    kept: dict = {}
    _keep_best(kept, "a", {"error": "ValueError: boom"})
    _keep_best(kept, "a", {"non_pad_tokens_per_s": 5.0, "first": True})
    _keep_best(kept, "a", {"non_pad_tokens_per_s": 7.0, "second": True})
    _keep_best(kept, "a", {"non_pad_tokens_per_s": 6.0, "third": True})
    assert kept["a"] == {"non_pad_tokens_per_s": 7.0, "second": True, "rounds_non_pad_tokens_per_s": [None, 5.0, 7.0, 6.0]}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_prompt_feed_benchmark_writes_its_report_and_the_feed_loses_nothing(tmp_path):
    run_benchmark("benchmarks.prompt_feed", "--quick", "--out", str(tmp_path), timeout=280)
    results = json.loads((tmp_path / "prompt_feed.json").read_text())
    assert [row["callers"] for row in results["throughput"]] == [1, 4]
    for row in results["throughput"]:
        for side in ("feed", "loader"):
            assert row[side]["prompts"] >= 128 and row[side]["prompts_per_s"] > 0
    checkpoint = results["checkpoint"]
    assert checkpoint["outstanding"] == 300 and checkpoint["feed_rehanded_same_uids_in_order"] is True
    chaos = results["chaos"]
    assert chaos["feed"]["counts"]["crashes"] == 2
    assert (chaos["feed"]["missing"], chaos["feed"]["duplicated"]) == (0, 0)
    for name in ("loader_latest", "loader_oldest"):  # what they lose or repeat is measured, not asserted
        assert chaos[name]["counts"]["crashes"] == 2 and len(chaos[name]["epochs"]) == 2
    markdown = (tmp_path / "prompt_feed.md").read_text()
    for heading in ("## Throughput", "## Checkpoint with 300 outstanding prompts", "## Accounting under chaos"):
        assert heading in markdown


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_quick_adaptive_feed_benchmark_compares_the_schedules_over_the_same_groups(tmp_path):
    run_benchmark("benchmarks.adaptive_feed", "--prompts", "32", "--groups-per-prompt", "3",
                  "--history-sizes", "1000", "5000", "--out", str(tmp_path), timeout=380)  # fmt: skip
    results = json.loads((tmp_path / "adaptive_feed.json").read_text())
    assert list(results["mixes"]) == ["uniform difficulty", "U-shaped difficulty"]
    for runs in results["mixes"].values():
        assert [run["schedule"] for run in runs] == ["uniform", "difficulty_filter", "prioritized"]
        for run in runs:
            assert run["groups"] == sum(epoch["groups"] for epoch in run["epochs"]) == 96
            assert run["history"]["prompts"] == 32 and run["history"]["bytes"] <= 16 * 32
        assert runs[0]["skipped"] == {} and runs[1]["skipped"] and runs[2]["skipped"]
    assert [row["checkpoint_bytes_per_prompt"] for row in results["history_cost"]] == [16.0, 16.0]
    assert (tmp_path / "adaptive_feed.png").read_bytes()[:8] == PNG_SIGNATURE
    assert "## U-shaped difficulty" in (tmp_path / "adaptive_feed.md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_short_ray_plateau_run_samples_every_process_and_fits_each_quarter(tmp_path):
    run_benchmark("benchmarks.ray_plateau", "--minutes", "0.5", "--every", "100", "--out", str(tmp_path), timeout=280)
    results = json.loads((tmp_path / "ray_plateau.json").read_text())
    assert len(results["rows"]) >= 4 and results["steps"] >= 400
    assert set(results["quarter_slopes"]) == {"coordinator", "feed", "driver", "coordinator rank 0", "coordinator rank 1"}
    assert all(len(slopes) == 4 for slopes in results["quarter_slopes"].values())
    assert max(row["coordinator_objects"] for row in results["rows"]) < 20
    assert (tmp_path / "ray_plateau.png").read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_short_actor_churn_run_measures_every_way_of_replacing(tmp_path):
    run_benchmark("benchmarks.actor_churn", "--actors", "6", "--every", "3", "--out", str(tmp_path), timeout=280)
    results = json.loads((tmp_path / "actor_churn.json").read_text())
    assert list(results) == ["new_actor", "class_per_actor", "ray_restart"]
    for way, run in results.items():
        assert [count for count, _ in run["points"]] == [0, 3, 6], way
        assert all(mb > 20 for _, mb in run["points"]), f"{way}: an owner's memory below 20 MB is not a Ray actor's: {run['points']}"
    assert "| ray_restart | 6 |" in (tmp_path / "actor_churn.md").read_text()
