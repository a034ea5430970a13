"""Every documented PromQL query, dashboard panel and alert rule, against a real Prometheus.

A Prometheus server (the Debian package ``prometheus``: ``bash scripts/install_prometheus.sh``)
scrapes the session's Ray metrics endpoint every second while one scenario runs on the session's
Ray: a packed coordinator over a dataset with corrupt samples (skipped samples, cut-to-stub samples,
a checkpoint loaded before the first step, two rank actors killed and recovered, a rewind to a
checkpoint) and a prompt feed over a mixture with a ``difficulty_filter`` schedule (acks with
outcomes that retire and defer prompts, drops with a reason, checkpoints taken). Then, at one
evaluation time (:attr:`Scenario.at`, when every series the checks need has moved in Prometheus):

- every query of a ```` ```promql ```` block of README.md and docs/**/*.md is evaluated and checked
  against :data:`EXPECTED` (labels and plausible values; a query without an entry fails, naming it);
- every panel target of the Grafana dashboard (``$coordinator``/``$feed`` as ``.*``) returns data;
- every alert rule of the rules file is loaded and healthy, and its expression evaluates.

With ``RL_DATA_SCREENSHOT=<file.png>`` (and Chromium installed), the Prometheus graph page of the
tokens/s query is saved there (docs/images/prometheus_tokens_per_s.png).

Ray's metrics agent exports every ~10 s; a counter's first exported value is not an increase for
Prometheus (``rate``/``increase`` see a series from its first sample), so the scenario runs in
phases, each after Prometheus saw the previous one: a rank kill counted in two exports (1, then 2)
is an ``increase`` of at least 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from distributed_fixtures import TIMEOUT_S, runtime_config, shut_down, train_spec
from test_prompt_feed import mixture_members  # noqa: F401 - the fixture

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "cluster_configs" / "monitoring" / "rl_data_dashboard.json"
ALERTS = ROOT / "cluster_configs" / "monitoring" / "rl_data_alerts.yml"
NAMESPACE = "rl_data_prometheus_tests"
INSTALL_HINT = "prometheus not installed: bash scripts/install_prometheus.sh (Debian package prometheus)"
#: Prometheus must be ready within this many seconds of its start.
READY_TIMEOUT_S = 30.0
#: Each phase of the scenario (steps until Prometheus saw what the next phase builds on) ends within this.
PHASE_TIMEOUT_S = 45.0
#: The scenario's fixture and the first test using it finish within this (pytest-timeout counts the
#: fixture's set-up in that test's time).
SCENARIO_TIMEOUT_S = 300
#: The drop reason the scenario gives (the documented drops-by-reason query must show it).
DROP_REASON = "zero_spread"
#: With a screenshot: steps and prompts run this much longer, for a graph of a steady rate.
SCREENSHOT_RUN_S = 110.0
#: The feed's max_sequence_length: filters the longest few of the 24 prompts of its mixture (32-47 tokens).
PROMPT_TOKEN_LIMIT = 44
#: The query the screenshot graphs (docs/guides/monitoring.md: tokens/s fed to training).
TOKENS_PER_S = "sum by (coordinator) (rate(ray_rl_data_rank_non_pad_tokens_total[1m]))"


# --- what each documented query must return ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Expect:
    """What a documented query returns at the scenario's evaluation time.

    ``labels``: the label names of every element: exactly these (an aggregation ``by (...)``), or
    at least these with ``exact=False`` (a query that keeps the series' labels: Ray's and
    Prometheus' own come along). ``select``: the elements of the scenario (label -> value; the
    values ``{coordinator}`` and ``{feed}`` are its names): at least one must be there, finite; the
    largest of them must be above ``above`` and every one at least ``at_least`` and at most
    ``at_most``. No value of the result may be negative (none of the documented quantities is); a
    NaN is allowed outside the scenario's elements (a quantile of another coordinator's histogram
    with no observation in the window, e.g. of an earlier test of the session).
    """

    labels: tuple[str, ...]
    exact: bool = True
    select: dict[str, str] = dataclasses.field(default_factory=dict)
    above: float | None = None
    at_least: float | None = None
    at_most: float | None = None


C, F = "{coordinator}", "{feed}"

#: Documented query (whitespace collapsed) -> what it returns. A query found in the docs that is
#: not here fails the test: add its entry.
EXPECTED: dict[str, Expect] = {
    "sum by (coordinator) (rate(ray_rl_data_rank_non_pad_tokens_total[1m]))":
        Expect(("coordinator",), select={"coordinator": C}, above=0),
    "rate(ray_rl_data_rank_non_pad_tokens_total[1m])":
        Expect(("coordinator", "rank"), exact=False, select={"coordinator": C}, above=0),
    "rate(ray_rl_data_coordinator_steps_total[1m])":
        Expect(("coordinator",), exact=False, select={"coordinator": C}, above=0),
    "histogram_quantile(0.99, sum by (le) (rate(ray_rl_data_coordinator_step_latency_seconds_bucket[5m])))":
        Expect((), above=0, at_most=60),
    "sum by (rank) (rate(ray_rl_data_rank_blocked_seconds_total[1m]))":
        Expect(("rank",), select={"rank": "0"}, at_least=0, at_most=1),
    "min by (rank) (ray_rl_data_rank_prefetch_depth)":
        Expect(("rank",), select={"rank": "0"}, at_least=0),
    "avg by (rank) (ray_rl_data_rank_packing_efficiency)":
        Expect(("rank",), select={"rank": "0"}, above=0, at_most=1),
    "increase(ray_rl_data_rank_skipped_samples_total[1h])":
        Expect(("coordinator", "rank"), exact=False, select={"coordinator": C}, at_least=0),
    "increase(ray_rl_data_rank_zero_loss_samples_total[1h])":
        Expect(("coordinator", "rank"), exact=False, select={"coordinator": C}, at_least=0),
    "sum by (kind) (increase(ray_rl_data_coordinator_restores_total[1h]))":
        Expect(("kind",), select={"kind": "rank_recovery"}, at_least=1),
    "max by (coordinator) (ray_rl_data_coordinator_committed_step)":
        Expect(("coordinator",), select={"coordinator": C}, at_least=1),
    "sum by (feed) (rate(ray_rl_data_feed_acks_total[1m]))":
        Expect(("feed",), select={"feed": F}, above=0),
    "sum by (reason) (rate(ray_rl_data_feed_drops_total[5m]))":
        Expect(("reason",), select={"reason": DROP_REASON}, above=0),
    "max by (feed) (ray_rl_data_feed_oldest_outstanding_age_seconds)":
        Expect(("feed",), select={"feed": F}, at_least=0),
    "histogram_quantile(0.99, sum by (coordinator, le) (rate(ray_rl_data_coordinator_checkpoint_seconds_bucket[1h])))":
        Expect(("coordinator",), select={"coordinator": C}, above=0, at_most=300),
    "max by (coordinator) (ray_rl_data_coordinator_checkpoint_bytes)":
        Expect(("coordinator",), select={"coordinator": C}, above=1000),
    "sum by (member) (rate(ray_rl_data_feed_member_taken_total[5m]))":
        Expect(("member",), select={"member": "easy"}, above=0),
    # docs/guides/adaptive-prompts.md: samples generated per useful (not zero-spread) group, >= 1
    "sum(rate(ray_rl_data_feed_generated_samples_total[5m])) / (sum(rate(ray_rl_data_feed_outcomes_total[5m])) - "
    "(sum(rate(ray_rl_data_feed_zero_spread_outcomes_total[5m])) or vector(0)))":
        Expect((), at_least=1),
}  # fmt: skip


def normalized(query: str) -> str:
    return " ".join(query.split())


def documented_queries(root: Path = ROOT) -> list[tuple[str, str]]:
    """``(file:line, query)`` of every query in a ```` ```promql ```` block of README.md and
    docs/**/*.md: one a line (lines starting with ``#`` are comments), continued on the indented
    lines that follow it."""
    queries: list[tuple[str, str]] = []
    for path in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        if not path.is_file():
            continue
        inside = False
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            stripped = line.strip()
            if not inside:
                inside = stripped.startswith("```") and stripped[3:].strip().lower() == "promql"
                continue
            if stripped.startswith("```"):
                inside = False
            elif not stripped or stripped.startswith("#"):
                continue
            elif line[0].isspace() and queries and queries[-1][0].startswith(f"{path.relative_to(root)}:"):
                where, query = queries[-1]
                queries[-1] = (where, f"{query}\n{line}")
            else:
                queries.append((f"{path.relative_to(root)}:{number}", line))
    return queries


# --- Prometheus ----------------------------------------------------------------------------------


def prometheus_binary() -> str | None:
    found = shutil.which("prometheus")
    if found is None and os.access("/usr/bin/prometheus", os.X_OK):
        found = "/usr/bin/prometheus"
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclasses.dataclass
class Prometheus:
    """A Prometheus server of this module (its HTTP API on ``url``)."""

    url: str
    process: subprocess.Popen
    log: Path

    def log_tail(self, lines: int = 25) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def api(self, path: str, **params: Any) -> dict[str, Any]:
        """The JSON answer of ``/api/v1/<path>`` (an error answer too: its ``status`` is ``error``)."""
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        request = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:  # 400/422/503: the body says why
            body = error.read().decode(errors="replace")
            with contextlib.suppress(ValueError):
                return json.loads(body)
            return {"status": "error", "errorType": f"HTTP {error.code}", "error": body}

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to (at ``at``, default now); raises on an error."""
        answer = self.api("query", query=expr, time=at)
        if answer.get("status") != "success":
            raise AssertionError(f"Prometheus refused {expr!r}: {answer.get('errorType')}: {answer.get('error')}")
        data = answer["data"]
        if data["resultType"] != "vector":
            raise AssertionError(f"{expr!r} is a {data['resultType']}, not an instant vector")
        return data["result"]


def start_prometheus(binary: str, work: Path, metrics_port: int, rule_files: list[Path]) -> Prometheus:
    """Prometheus scraping ``127.0.0.1:<metrics_port>`` every second, evaluating ``rule_files``
    every second, its data in ``work``; ready (``/-/ready``) or killed and the test failed with its log."""
    import yaml

    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [{"job_name": "ray", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = work / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                "--storage.tsdb.retention.time=1d",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return server
        time.sleep(0.2)
    stop_prometheus(server)
    why = f"exited (code {process.returncode})" if process.returncode not in (None, -15) else f"was not ready within {READY_TIMEOUT_S:g} s"
    pytest.fail(f"Prometheus {why}; its log:\n{server.log_tail()}")


def check_rules(path: Path) -> str:
    """What ``promtool check rules`` finds wrong with ``path`` ("" if nothing, or without promtool)."""
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    if not os.access(promtool, os.X_OK):
        return ""
    checked = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    return "" if checked.returncode == 0 else f"promtool check rules {path.name}:\n{checked.stdout}{checked.stderr}"


def stop_prometheus(server: Prometheus) -> None:
    if server.process.poll() is None:
        server.process.terminate()
        try:
            server.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(timeout=10)


# --- the scenario --------------------------------------------------------------------------------


@dataclasses.dataclass
class Scenario:
    prometheus: Prometheus
    coordinator: str
    feed: str
    #: the evaluation time (Unix seconds): every check evaluates its queries at this moment
    at: float
    #: what the scenario did (for failure messages)
    events: list[str]
    #: steps and prompts more (the screenshot's graph runs on)
    driver: "_Driver"
    #: the copy of the alert rules file Prometheus loaded (None: none, or a bad one, not loaded)
    rules_file: Path | None

    def placeholders(self, value: str) -> str:
        return value.replace(C, self.coordinator).replace(F, self.feed)


def _unit(*parts: object) -> float:
    return int.from_bytes(hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest(), "big") / 2**64


class _Driver:
    """The coordinator's trainer and the feed's rollout worker + trainer, one tick at a time."""

    def __init__(self, ray: Any, coordinator: Any, rollout: Any, trainer: Any) -> None:
        from rl_data.prompt_feed.outcomes import Outcome

        self.ray, self.coordinator, self.rollout, self.trainer, self.Outcome = ray, coordinator, rollout, trainer, Outcome
        self.steps = self.prompts = 0

    def tick(self) -> None:
        step, refs = self.ray.get(self.coordinator.next_step.remote(), timeout=TIMEOUT_S)
        self.ray.get(refs, timeout=TIMEOUT_S)
        self.ray.get(self.coordinator.commit.remote(step), timeout=TIMEOUT_S)
        self.steps += 1
        prompts = self.rollout.take(3, wait_s=5.0)
        if prompts and self.steps % 5 == 0:  # given back: handed out again later
            self.trainer.release([prompts[0].uid])
            prompts = prompts[1:]
        acked, outcomes, dropped = [], [], []
        for prompt in prompts:
            self.prompts += 1
            kind = _unit("kind", prompt.key)  # a third always solved (retire), a third never (defer)
            if kind < 2 / 3 and kind >= 1 / 3 and self.prompts % 2:
                dropped.append(prompt.uid)  # with an all-wrong outcome
                continue
            acked.append(prompt.uid)
            outcomes.append(self.Outcome(4, correct=4 if kind < 1 / 3 else 0 if kind < 2 / 3 else 2))
        if acked:
            self.trainer.ack(acked, outcomes=outcomes)
        if dropped:
            self.trainer.drop(dropped, DROP_REASON, outcomes=[self.Outcome(4, correct=0)] * len(dropped))

    def kill_rank(self, rank: int) -> str:
        name = self.ray.get(self.coordinator.status.remote(), timeout=TIMEOUT_S)["rank_actor_names"][rank]
        self.ray.kill(self.ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
        return name


def seen(selector: str) -> str:
    """A condition: Prometheus has two samples of ``selector`` at least (``increase`` needs two)."""
    return f"count_over_time({selector}[1m]) >= 2"


def _run_until(driver: _Driver, prometheus: Prometheus, conditions: dict[str, str], what: str, events: list[str]) -> None:
    """Tick until every PromQL condition returns a non-empty vector (or fail after PHASE_TIMEOUT_S)."""
    deadline, started = time.monotonic() + PHASE_TIMEOUT_S, time.monotonic()
    missing = list(conditions)
    while time.monotonic() < deadline:
        driver.tick()
        missing = [name for name, expr in conditions.items() if not prometheus.query(expr)]
        if not missing:
            events.append(f"{what}: {time.monotonic() - started:.1f} s, {driver.steps} steps, {driver.prompts} prompts so far")
            return
        time.sleep(0.2)
    pytest.fail(
        f"{what}: Prometheus did not see {missing} within {PHASE_TIMEOUT_S:g} s "
        f"({[conditions[m] for m in missing]}); so far: {events}; Prometheus log:\n{prometheus.log_tail()}"
    )


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    """The Prometheus binary: skip without one (fail under RL_DATA_REQUIRE_PROMETHEUS=1, as CI sets it)."""
    binary = prometheus_binary()
    if binary is None:
        if os.environ.get("RL_DATA_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(f"{INSTALL_HINT}; RL_DATA_REQUIRE_PROMETHEUS=1 requires it")
        pytest.skip(INSTALL_HINT)
    return binary


@pytest.fixture(scope="module")
def scenario(prometheus_bin, ray_session, metrics_port, corrupt_energon_dataset, mixture_members, tmp_path_factory) -> Iterator[Scenario]:  # noqa: F811
    from rl_data.distributed.config import LoaderSpec
    from rl_data.distributed.coordinator import start_data_coordinator
    from rl_data.prompt_feed.client import attach_feed
    from rl_data.prompt_feed.feed import FeedConfig, start_prompt_feed
    from rl_data.prompt_feed.schedules import ScheduleConfig

    ray, suffix = ray_session, uuid.uuid4().hex[:8]
    coordinator_name, feed_name = f"prom-coordinator-{suffix}", f"prom-feed-{suffix}"
    # packed, 256-token packs: some conversations reach the limit (cut to stubs: zero-loss samples)
    spec = train_spec(
        corrupt_energon_dataset,
        data_config={"energon": {"shuffle_buffer_size": 20, "max_samples_per_sequence": 10, "packing_buffer_size": 8}, "shuffle": True},
        packing_algorithm="first_fit_decreasing",
        max_sequence_length=256,
    )
    coordinator_config = runtime_config(2, 1, name=coordinator_name, namespace=NAMESPACE)
    energon = {"task": "rl_prompt", "shuffle_buffer_size": 6, "max_samples_per_sequence": 2}
    mixture = [{"name": name, "path": path, "weight": 0.5} for name, path in mixture_members.items()]
    feed_spec = LoaderSpec(
        data_config={"energon": energon, "shuffle": True, "task": {"generation_padding": "left"}},
        source={"mixture": mixture, "split": "train", "epoch_mode": "virtual", "virtual_epoch_length": 5},
        batch_size=4, max_sequence_length=PROMPT_TOKEN_LIMIT,
    )  # fmt: skip
    schedule = ScheduleConfig(
        name="difficulty_filter", options={"retire_after": 1, "defer_after": 1, "defer_for": 1, "max_retired_share": 0.5}
    )
    feed_config = runtime_config(1, 2, name=feed_name, namespace=NAMESPACE)
    events: list[str] = []
    coordinator = feed_handle = None
    work = tmp_path_factory.mktemp("prometheus")
    rule_files = []
    if ALERTS.is_file() and not check_rules(ALERTS):  # a copy: the file may change while the test runs
        rule_files.append(work / ALERTS.name)  # (Prometheus refuses to start with a bad rules file:
        shutil.copyfile(ALERTS, rule_files[0])  # then only the alerts test fails, with promtool's message)
    prometheus = start_prometheus(prometheus_bin, work, metrics_port, rule_files)
    try:
        coordinator = start_data_coordinator(coordinator_config, spec)
        feed_handle = start_prompt_feed(feed_config, feed_spec, FeedConfig(max_outstanding=16, schedule=schedule))
        rollout, trainer = attach_feed(feed_name, NAMESPACE, timeout_s=TIMEOUT_S)
        checkpoints = work / "checkpoints"
        # a checkpoint loaded before the first step: restores_total{kind="checkpoint"}
        ray.get(coordinator.save_checkpoint.remote(str(checkpoints / "start")), timeout=TIMEOUT_S)
        assert ray.get(coordinator.load_checkpoint.remote(str(checkpoints / "start")), timeout=TIMEOUT_S) == 0
        driver = _Driver(ray, coordinator, rollout, trainer)
        ours, feed = f'coordinator="{coordinator_name}"', f'feed="{feed_name}"'
        recoveries = f'ray_rl_data_coordinator_restores_total{{{ours},kind="rank_recovery"}}'

        # 1. steps and prompts until Prometheus has the scenario's series
        _run_until(driver, prometheus, {
            "tokens": seen(f"ray_rl_data_rank_non_pad_tokens_total{{{ours}}}"),
            "acks": seen(f"ray_rl_data_feed_acks_total{{{feed}}}"),
        }, "series exported", events)  # fmt: skip
        events.append(f"killed {driver.kill_rank(0)}")
        trainer.save_checkpoint(str(checkpoints / "feed"))
        ray.get(coordinator.save_checkpoint.remote(str(checkpoints / "rewind")), timeout=TIMEOUT_S)

        # 2. the first recovery and the first checkpoints exported: kill another rank (an increase of 1),
        #    rewind the coordinator and the feed, checkpoint both again (their checkpoint histograms move)
        _run_until(driver, prometheus, {
            "recovery 1": f"{recoveries} >= 1",
            "feed checkpoint": seen(f"ray_rl_data_feed_checkpoint_seconds_count{{{feed}}}"),
        }, "rank recovery 1 exported", events)  # fmt: skip
        events.append(f"killed {driver.kill_rank(1)}")
        driver.tick()  # the dead rank is replaced and restored (a rewind would renew it instead)
        ray.get(coordinator.load_checkpoint.remote(str(checkpoints / "rewind")), timeout=TIMEOUT_S)
        ray.get(coordinator.state_dict.remote(), timeout=TIMEOUT_S)
        trainer.load_checkpoint(str(checkpoints / "feed"))
        trainer.state_dict()

        # 3. until every rate and increase the checks read has moved in Prometheus
        _run_until(driver, prometheus, {
            "recovery 2": f"{recoveries} >= 2",
            "recovery increase": f"increase({recoveries}[1h]) >= 1",
            "skipped samples": seen(f"ray_rl_data_rank_skipped_samples_total{{{ours}}}"),
            "zero-loss samples": seen(f"ray_rl_data_rank_zero_loss_samples_total{{{ours}}}"),
            "rewind": seen(f'ray_rl_data_coordinator_restores_total{{{ours},kind="rewind"}}'),
            "tokens/s": f"sum(rate(ray_rl_data_rank_non_pad_tokens_total{{{ours}}}[1m])) > 0",
            "steps/s": f"sum(rate(ray_rl_data_coordinator_steps_total{{{ours}}}[1m])) > 0",
            "step latency": f"sum(rate(ray_rl_data_coordinator_step_latency_seconds_count{{{ours}}}[1m])) > 0",
            "acks/s": f"sum(rate(ray_rl_data_feed_acks_total{{{feed}}}[1m])) > 0",
            "drops/s": f'sum(rate(ray_rl_data_feed_drops_total{{{feed},reason="{DROP_REASON}"}}[1m])) > 0',
            "checkpoints/s": f"sum(rate(ray_rl_data_coordinator_checkpoint_seconds_count{{{ours}}}[1h])) > 0",
            "feed checkpoints/s": f'sum(rate(ray_rl_data_feed_checkpoint_seconds_count{{{feed}}}[1h])) > 0',
            "first hand-outs/s": f'sum(rate(ray_rl_data_feed_member_taken_total{{{feed},member="easy"}}[5m])) > 0',
            "filtered": seen(f'ray_rl_data_rank_filtered_samples_total{{coordinator="{feed_name}"}}'),
            "releases": seen(f"ray_rl_data_feed_releases_total{{{feed}}}"),
            "feed rewind": seen(f'ray_rl_data_feed_restores_total{{{feed},kind="rewind"}}'),
            "retired": f"ray_rl_data_feed_retired_prompts{{{feed}}} > 0",
            "deferred": f"ray_rl_data_feed_deferred_prompts{{{feed}}} > 0",
            "skipped": seen(f"ray_rl_data_feed_skipped_total{{{feed}}}"),
        }, "every rate moved", events)  # fmt: skip
        at = time.time()
        yield Scenario(prometheus, coordinator_name, feed_name, at, events, driver, rule_files[0] if rule_files else None)
    finally:
        for handle, name in ((feed_handle, feed_name), (coordinator, coordinator_name)):
            if handle is not None:
                with contextlib.suppress(Exception):
                    shut_down(ray, handle, name, NAMESPACE)
        stop_prometheus(prometheus)


# --- the checks ----------------------------------------------------------------------------------


def _labels(element: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in element["metric"].items() if k != "__name__"}


def _value(element: dict[str, Any]) -> float:
    return float(element["value"][1])


def _problems(expect: Expect, result: list[dict[str, Any]], scenario: Scenario) -> list[str]:
    if not result:
        return ["empty result"]
    problems = []
    wanted = set(expect.labels)
    for element in result:
        labels, value = _labels(element), _value(element)
        if expect.exact and set(labels) != wanted:
            problems.append(f"labels {sorted(labels)}, expected exactly {sorted(wanted)}")
        elif not wanted <= set(labels):
            problems.append(f"labels {sorted(labels)}, expected at least {sorted(wanted)}")
        if value < 0 or value == math.inf:
            problems.append(f"value {value} of {labels}: negative or infinite")
    select = {k: scenario.placeholders(v) for k, v in expect.select.items()}
    chosen = [_value(e) for e in result if all(_labels(e).get(k) == v for k, v in select.items())]
    if not chosen:
        problems.append(f"no element with labels {select}")
    elif not all(math.isfinite(v) for v in chosen):
        problems.append(f"values {chosen} of {select}: not finite")
    else:
        if expect.above is not None and not max(chosen) > expect.above:
            problems.append(f"values {chosen} of {select}: none is > {expect.above}")
        if expect.at_least is not None and not min(chosen) >= expect.at_least:
            problems.append(f"values {chosen} of {select}: not all >= {expect.at_least}")
        if expect.at_most is not None and not max(chosen) <= expect.at_most:
            problems.append(f"values {chosen} of {select}: not all <= {expect.at_most}")
    return problems


def _shown(result: list[dict[str, Any]], limit: int = 6) -> str:
    return "; ".join(f"{_labels(e)} = {e['value'][1]}" for e in result[:limit]) + (" ..." if len(result) > limit else "")


def test_the_docs_have_promql_queries_and_each_has_an_expectation():
    """Without Prometheus: the docs' queries are found, and each one has its :data:`EXPECTED` entry."""
    queries = documented_queries()
    assert queries, "no ```promql block found in README.md or docs/"
    missing = [f"{where}: {normalized(query)!r}" for where, query in queries if normalized(query) not in EXPECTED]
    assert not missing, (
        "documented PromQL queries without an expectation: add an entry to EXPECTED in tests/test_prometheus.py "
        "(the labels it returns and its plausible values):\n  " + "\n  ".join(missing)
    )
    stale = sorted(set(EXPECTED) - {normalized(q) for _, q in queries})
    assert not stale, f"EXPECTED has entries for queries no doc has any more (remove them): {stale}"


def test_promql_blocks_are_read_one_query_a_line_with_comments_and_indented_continuations(tmp_path):
    (tmp_path / "docs" / "guides").mkdir(parents=True)
    (tmp_path / "README.md").write_text("```promql\n# a comment\nup\n```\n```bash\nnot_promql\n```\n")
    (tmp_path / "docs" / "guides" / "a.md").write_text(
        "text\n```promql\nsum(rate(a_total[5m]))\n  / sum(rate(b_total[5m]))\n\n  # indented comment\nmax(c)\n```\nafter\n"
    )
    assert documented_queries(tmp_path) == [
        ("README.md:3", "up"),
        ("docs/guides/a.md:3", "sum(rate(a_total[5m]))\n  / sum(rate(b_total[5m]))"),
        ("docs/guides/a.md:7", "max(c)"),
    ]


@pytest.mark.slow
@pytest.mark.timeout(SCENARIO_TIMEOUT_S)
def test_the_documented_queries_return_what_the_docs_say(scenario):
    failures = []
    for where, query in documented_queries():
        expect = EXPECTED.get(normalized(query))
        if expect is None:
            failures.append(f"{where}: {normalized(query)!r}: no expectation: add an entry to EXPECTED in tests/test_prometheus.py")
            continue
        try:
            result = scenario.prometheus.query(query, scenario.at)
        except AssertionError as error:
            failures.append(f"{where}: {error}")
            continue
        failures += [f"{where}: {normalized(query)!r}: {p} (result: {_shown(result)})" for p in _problems(expect, result, scenario)]
    assert not failures, "\n".join(failures) + f"\nscenario: {scenario.events}"


def _panel_targets(panels: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    """``(panel title, expr)`` of every target of ``panels``, rows' nested panels included."""
    for panel in panels:
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield panel.get("title", "?"), target["expr"]
        yield from _panel_targets(panel.get("panels", []))


@pytest.mark.slow
@pytest.mark.timeout(SCENARIO_TIMEOUT_S)
def test_every_dashboard_panel_query_returns_data(scenario):
    if not DASHBOARD.is_file():
        pytest.fail(f"{DASHBOARD.relative_to(ROOT)} is missing")
    dashboard = json.loads(DASHBOARD.read_text())
    targets = list(_panel_targets(dashboard.get("panels", [])))
    assert targets, f"{DASHBOARD.relative_to(ROOT)} has no panel target with an expr"
    broken, empty = [], []
    for title, expr in targets:
        concrete = expr.replace("$coordinator", ".*").replace("$feed", ".*")
        if re.search(r"\$\w+|\[\[", concrete):
            broken.append(f"{title!r}: {expr!r}: a template variable other than $coordinator/$feed")
            continue
        try:
            result = scenario.prometheus.query(concrete, scenario.at)
        except AssertionError as error:
            broken.append(f"{title!r}: {error}")
            continue
        if not result:
            empty.append(f"{title!r}: {expr!r}")
    problems = [f"invalid: {b}" for b in broken] + [f"empty: {e}" for e in empty]
    assert not problems, f"{len(problems)} of {len(targets)} dashboard panel queries:\n" + "\n".join(problems)


@pytest.mark.slow
@pytest.mark.timeout(SCENARIO_TIMEOUT_S)
def test_every_alert_rule_is_loaded_healthy_and_evaluates(scenario):
    import yaml

    if not ALERTS.is_file():
        pytest.fail(f"{ALERTS.relative_to(ROOT)} is missing")
    wrong = check_rules(ALERTS)
    assert not wrong, wrong
    assert scenario.rules_file is not None, f"{ALERTS.name} appeared after Prometheus started"
    documented = [rule for group in yaml.safe_load(scenario.rules_file.read_text())["groups"] for rule in group["rules"]]
    assert documented, f"{ALERTS.name} has no rule"
    deadline = time.monotonic() + 15  # every rule evaluated at least once (every second)
    while True:
        answer = scenario.prometheus.api("rules")
        assert answer["status"] == "success", answer
        loaded = [rule for group in answer["data"]["groups"] for rule in group["rules"]]
        if all(rule.get("health") == "ok" for rule in loaded) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    names = sorted(rule.get("alert") or rule.get("record") for rule in documented)
    assert sorted(rule["name"] for rule in loaded) == names, "Prometheus loaded other rules than the file has"
    unhealthy = [f"{r['name']}: health {r.get('health')!r}, {r.get('lastError')!r}" for r in loaded if r.get("health") != "ok" or r.get("lastError")]
    assert not unhealthy, "\n".join(unhealthy)
    failures = []
    for rule in documented:
        try:
            scenario.prometheus.query(rule["expr"], scenario.at)
        except AssertionError as error:
            failures.append(f"{rule.get('alert') or rule.get('record')}: {error}")
    assert not failures, "\n".join(failures)


def screenshot_of_the_tokens_per_s_graph(scenario):
    """The Prometheus graph page of the tokens/s query, saved to ``RL_DATA_SCREENSHOT``
    (docs/images/prometheus_tokens_per_s.png) with Chromium (Debian's ``chromium``), after
    SCREENSHOT_RUN_S more of steps (the other checks evaluate at ``scenario.at``: what comes later
    does not change them). A test only when ``RL_DATA_SCREENSHOT`` is set: it draws a docs image."""
    target = os.environ["RL_DATA_SCREENSHOT"]
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium is not None, "RL_DATA_SCREENSHOT needs Chromium: apt-get install chromium"
    deadline = time.monotonic() + SCREENSHOT_RUN_S
    while time.monotonic() < deadline:
        scenario.driver.tick()
        time.sleep(0.2)
    url = f"{scenario.prometheus.url}/graph?" + urllib.parse.urlencode(
        {"g0.expr": TOKENS_PER_S, "g0.tab": "0", "g0.range_input": "3m"}
    )
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.remove(target)
    shot = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,900",
         "--virtual-time-budget=10000", f"--screenshot={target}", url],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert shot.returncode == 0 and os.path.isfile(target), f"chromium failed:\n{shot.stderr[-2000:]}"
    assert os.path.getsize(target) > 20_000, f"{target}: {os.path.getsize(target)} bytes: blank?"
    from PIL import Image

    with Image.open(target) as image:  # the graph area: the lines are the only saturated pixels there
        width, height = image.size
        area = image.convert("HSV").crop((int(0.06 * width), int(0.42 * height), int(0.96 * width), int(0.85 * height)))
        colored = sum(1 for _, saturation, value in area.getdata() if saturation > 100 and value > 80)
    assert colored > 300, f"{target}: {colored} colored pixels in the graph area: no line drawn?"


if os.environ.get("RL_DATA_SCREENSHOT"):
    test_a_screenshot_of_the_tokens_per_s_graph = pytest.mark.slow(
        pytest.mark.timeout(SCENARIO_TIMEOUT_S)(screenshot_of_the_tokens_per_s_graph)
    )
