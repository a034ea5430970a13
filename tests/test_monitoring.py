"""The Grafana dashboard and the Prometheus alert rules (rl_data.monitoring): built from the metric
definitions, refusing a series or label they lack, checked in as generated, and accepted by promtool.
Pure: no Ray."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rl_data.distributed import metrics as runtime_metrics
from rl_data.distributed.metrics import MetricDefinition
from rl_data.monitoring import alert_rules, dashboard
from rl_data.monitoring.dashboard import check_panel_query
from rl_data.monitoring.promql import MonitoringError, check_expression, select
from rl_data.prompt_feed import metrics as feed_metrics

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "cluster_configs" / "monitoring"
DASHBOARD, ALERTS, ALERT_TESTS = (
    MONITORING / "rl_data_dashboard.json", MONITORING / "rl_data_alerts.yml", MONITORING / "rl_data_alerts.test.yml",
)  # fmt: skip
PROMTOOL_HINT = "promtool not installed (Debian package prometheus)"


def _panels() -> list[dict]:
    return [panel for panel in dashboard()["panels"] if panel["type"] != "row"]


def _exprs() -> list[str]:
    return [target["expr"] for panel in _panels() for target in panel["targets"]]


def _row_titles() -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            current = rows.setdefault(panel["title"], [])
        else:
            current.append(panel["title"])
    return rows


# ---------------------------------------------------------------------------------- dashboard


def test_the_dashboard_has_its_rows_panels_and_variables():
    board = dashboard()
    assert (board["uid"], board["title"], board["schemaVersion"]) == ("rl-data", "rl_data", 39)
    rows = _row_titles()
    assert list(rows) == ["Loader", "Coordinator", "Prompt feed"]
    assert {"Tokens/s fed", "Tokens/s fed per rank", "Prefetch depth", "Blocked share", "Packing efficiency"} <= set(
        rows["Loader"]
    )
    assert {"Steps/s", "Step latency", "Committed step", "Restores by kind (per hour)", "Checkpoint duration",
            "Checkpoint size"} <= set(rows["Coordinator"])  # fmt: skip
    assert {"Drops/s by reason", "Outstanding prompts", "Oldest outstanding age", "First hand-outs/s by member",
            "Member pass rate", "Samples per useful group", "Checkpoint duration"} <= set(rows["Prompt feed"])  # fmt: skip

    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    assert list(variables) == ["datasource", "coordinator", "feed"]
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    assert variables["coordinator"]["definition"] == "label_values(ray_rl_data_coordinator_steps_total, coordinator)"
    assert variables["feed"]["definition"] == "label_values(ray_rl_data_feed_taken_total, feed)"
    for name in ("coordinator", "feed"):
        assert variables[name]["multi"] and variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
        assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}

    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in _panels():
        assert panel["datasource"]["uid"] == "${datasource}" and panel["description"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert [t["refId"] for t in panel["targets"]] == [chr(ord("A") + i) for i in range(len(panel["targets"]))]


def test_every_panel_query_names_known_series_and_labels_and_filters_by_a_variable():
    for expr in _exprs():
        check_expression(expr)
        assert "$__" not in expr, expr
        assert all(re.fullmatch(r"\d+[smh]", window) for window in re.findall(r"\[([^\]]*)\]", expr)), expr
        for selector in re.findall(r"\bray_\w+\{[^}]*\}", expr):
            assert re.search(r'(coordinator|feed)=~"\$(coordinator|feed)"', selector), selector
    assert any('coordinator=~"$feed"' in expr for expr in _exprs()), "the feed row shows its ranks"


def test_every_metric_definition_has_a_panel():
    exprs = "\n".join(_exprs())
    for definition in runtime_metrics.METRICS + feed_metrics.METRICS:
        series = definition.series + ("_bucket" if definition.kind == "histogram" else "")
        assert re.search(rf"\b{series}\{{", exprs), f"no panel shows {series}"


def test_a_query_over_an_undefined_metric_or_label_is_refused(monkeypatch):
    renamed = dataclasses.replace(runtime_metrics.RANK_NON_PAD_TOKENS, name="rl_data_rank_tokens")
    with pytest.raises(MonitoringError, match=r"no metric definition exports the series 'ray_rl_data_rank_tokens_total'"):
        select(renamed, coordinator='=~"$coordinator"')
    monkeypatch.setattr(runtime_metrics, "RANK_NON_PAD_TOKENS", renamed)  # renamed outside METRICS
    with pytest.raises(MonitoringError, match="ray_rl_data_rank_tokens_total"):
        dashboard()

    with pytest.raises(MonitoringError, match=r"ray_rl_data_rank_batches_total has no label \['feed'\]"):
        select(runtime_metrics.RANK_BATCHES, feed='=~"$feed"')
    with pytest.raises(MonitoringError, match=r"groups by \['member'\], which none of its series carries"):
        check_expression("sum by (member) (rate(ray_rl_data_rank_batches_total[1m]))")
    with pytest.raises(MonitoringError, match=r"matches \['le'\] on ray_rl_data_coordinator_step_latency_seconds_sum"):
        check_expression('ray_rl_data_coordinator_step_latency_seconds_sum{le="1"}')
    check_expression('sum by (le) (ray_rl_data_coordinator_step_latency_seconds_bucket{le="1"})')
    with pytest.raises(MonitoringError, match="no metric definition exports the series 'up'"):
        check_expression("up == bool 0 and on () ray_rl_data_feed_outstanding > 0")
    with pytest.raises(MonitoringError, match="no metric definition exports the series 'ray_rl_data_coordinator_step_latency_seconds'"):
        select(runtime_metrics.COORDINATOR_STEP_LATENCY)


def test_a_panel_query_without_a_variable_filter_or_with_a_grafana_macro_is_refused():
    for unfiltered in ("rate(ray_rl_data_feed_acks_total[1m])", 'rate(ray_rl_data_feed_acks_total{feed="rl"}[1m])'):
        with pytest.raises(MonitoringError, match="is not filtered by a dashboard variable"):
            check_panel_query(unfiltered)
    with pytest.raises(MonitoringError, match="uses a Grafana macro"):
        check_panel_query('rate(ray_rl_data_feed_acks_total{feed=~"$feed"}[$__rate_interval])')


def test_a_renamed_metric_fails_the_generator(monkeypatch):
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    monkeypatch.setattr(feed_metrics, "ACKS", MetricDefinition("rl_data_feed_acked", "counter", "renamed", ("feed",)))
    with pytest.raises(generate.GenerationError, match="rl_data.monitoring: .*ray_rl_data_feed_acked_total"):
        generate.dashboard_json()
    with pytest.raises(generate.GenerationError, match="ray_rl_data_feed_acked_total"):
        generate.alert_rules_yaml()


# ------------------------------------------------------------------------------------- alerts


def test_the_alert_rules_cover_waiting_ranks_old_prompts_and_recoveries():
    (group,) = alert_rules()["groups"]
    assert group["name"] == "rl_data"
    rules = {rule["alert"]: rule for rule in group["rules"]}
    assert {"RlDataRankBlocksTrainer", "RlDataPromptOutstandingTooLong", "RlDataRankRecoveries"} <= set(rules)
    for rule in rules.values():
        check_expression(rule["expr"])
        assert rule["for"] and rule["labels"]["severity"] in {"info", "warning", "critical"}
        assert set(rule["annotations"]) == {"summary", "description"}
    blocked, old, recoveries = (rules[name]["expr"] for name in (
        "RlDataRankBlocksTrainer", "RlDataPromptOutstandingTooLong", "RlDataRankRecoveries"))  # fmt: skip
    assert "ray_rl_data_rank_blocked_seconds_total[10m]" in blocked and blocked.endswith("> 0.5")
    assert "ray_rl_data_feed_oldest_outstanding_age_seconds" in old and old.endswith("> 600")
    assert rules["RlDataPromptOutstandingTooLong"]["for"] == "5m"
    assert 'kind="rank_recovery"}[15m]' in recoveries and recoveries.endswith("> 3")


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("RL_DATA_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(f"{PROMTOOL_HINT}, and RL_DATA_REQUIRE_PROMETHEUS=1 requires it")
        pytest.skip(PROMTOOL_HINT)
    return promtool


def _run_promtool(*args: str | Path) -> None:
    result = subprocess.run([_promtool(), *map(str, args)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_promtool_accepts_the_rules_and_their_test_cases():
    _run_promtool("check", "rules", ALERTS)
    _run_promtool("test", "rules", ALERT_TESTS)


def test_every_panel_query_parses_as_promql(tmp_path):
    """Each panel's query, its variables replaced by ``.*`` (as "All" does), as a recording rule."""
    exprs = [expr.replace("$coordinator", ".*").replace("$feed", ".*") for expr in _exprs()]
    rules = [{"record": f"rl_data:panel_{i}", "expr": expr} for i, expr in enumerate(exprs)]
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    _run_promtool("check", "rules", path)


# ------------------------------------------------------------------------------- generated files


def test_the_checked_in_files_are_what_the_generator_writes():
    assert json.loads(DASHBOARD.read_text()) == dashboard(), "run `.venv/bin/python docs/generate.py`"
    assert yaml.safe_load(ALERTS.read_text()) == alert_rules(), "run `.venv/bin/python docs/generate.py`"


def test_the_documented_queries_name_only_defined_series_and_labels():
    """Every line of a ```promql block of the docs (a renamed metric must not leave a dead query)."""
    lines = [
        line
        for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
        for block in re.findall(r"```promql\n(.*?)```", page.read_text(), re.S)
        for line in block.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert len(lines) >= 10
    for line in lines:
        check_expression(line)


def test_the_module_imports_neither_ray_nor_torch():
    code = "import sys, rl_data.monitoring; print(sorted({'ray', 'torch'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
