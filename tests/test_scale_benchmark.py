"""``benchmarks/scale.py``: its curve fit, and its quick mode end to end (outputs checked, never timings)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.scale import linear_fit

REPO = Path(__file__).resolve().parents[1]


def test_the_fit_gives_the_per_unit_cost_and_flags_growth_faster_than_linear():
    linear = linear_fit([8, 32, 128], [2 + 0.5 * g for g in (8, 32, 128)])
    assert math.isclose(linear["per_unit"], 0.5) and math.isclose(linear["fixed"], 2.0)
    assert math.isclose(linear["slope_ratio"], 1.0) and math.isclose(linear["at_1024"], 2 + 512)
    quadratic = linear_fit([8, 32, 128], [g * g for g in (8, 32, 128)])
    assert quadratic["slope_ratio"] == pytest.approx((128 + 32) / (32 + 8))


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_quick_run_writes_every_table_and_every_restore_is_exact(tmp_path):
    subprocess.run([sys.executable, "-m", "benchmarks.scale", "--quick", "--out", str(tmp_path)], cwd=REPO, check=True, timeout=1100)
    results = json.loads((tmp_path / "scale.json").read_text())
    assert [row["shards"] for row in results["shards"]] == [1, 2]
    assert all(row["exact"] and row["restarts"] == 1 for row in results["shards"])
    assert {(row["callers"], bool(row["pause_s"])) for row in results["feed_callers"]} == {(1, False), (4, False), (1, True), (4, True)}
    assert [level["outstanding"] for level in results["feed_outstanding"]["levels"]] == [200, 800]
    assert set(results["fits"]) == {"coordinator", "feed_callers", "feed_outstanding"}
    # the bare-Ray contenders ran beside every G and every closed-loop level
    assert all(row["bare_coordinator_cpu_ms_per_step"] > 0 and row["coordinator_cpu_over_bare"] > 0 for row in results["shards"])
    closed = [row for row in results["feed_callers"] if not row["pause_s"]]
    assert all(row["bare_take_p50_ms"] > 0 and row["bare_calls_per_s"] > 0 for row in closed)
    assert "bare_coordinator_cpu_ms_per_step" in results["fits"]["coordinator"]
    assert "| G | start-up s" in (tmp_path / "scale.md").read_text()
    assert (tmp_path / "scale.png").stat().st_size > 0
