"""PromQL over the metric definitions: selectors built from them, and a check that an expression
names only their series and, on each series, only its tags.

Every query of the dashboard and the alert rules goes through :func:`check_expression`, so a metric
renamed or removed in :mod:`rl_data.distributed.metrics` or :mod:`rl_data.prompt_feed.metrics`
fails the generation instead of leaving a panel that shows nothing.
"""

from __future__ import annotations

import functools
import re

from rl_data.distributed import metrics as runtime_metrics
from rl_data.distributed.metrics import MetricDefinition
from rl_data.prompt_feed import metrics as feed_metrics

#: Every metric a query may use: the rank actors', the coordinator's and the prompt feed's.
DEFINITIONS: tuple[MetricDefinition, ...] = runtime_metrics.METRICS + feed_metrics.METRICS
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

_SELECTOR = re.compile(r"\b([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
#: What is left of an expression without its selectors, grouping clauses, strings and ranges.
_NOT_A_NAME = re.compile(_SELECTOR.pattern + "|" + _GROUPING.pattern + r'|"(?:[^"\\]|\\.)*"|\[[^\]]*\]')
#: A bare name: an identifier that is not a function (followed by ``(``).
_BARE_NAME = re.compile(r"\b([a-zA-Z_:][\w:]*)\b(?!\s*\()")
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan"})


class MonitoringError(ValueError):
    """A query names a series or a label the metric definitions do not have."""


@functools.cache
def known_series() -> dict[str, tuple[str, ...]]:
    """``{Prometheus series: its labels}`` of :data:`DEFINITIONS`: a histogram's ``_bucket``, ``_sum`` and ``_count``
    (``_bucket`` with ``le``), every other metric's :attr:`~MetricDefinition.series`."""
    series: dict[str, tuple[str, ...]] = {}
    for definition in DEFINITIONS:
        if definition.kind != "histogram":
            series[definition.series] = definition.tag_keys
            continue
        for suffix in HISTOGRAM_SUFFIXES:
            series[definition.series + suffix] = definition.tag_keys + (("le",) if suffix == "_bucket" else ())
    return series


def select(metric: MetricDefinition, suffix: str = "", **matchers: str) -> str:
    """The selector ``<series><suffix>{<tag><matcher>, ...}`` of ``metric``, e.g.
    ``select(RANK_BATCHES, coordinator='=~"$coordinator"')``; refuses a metric that is not defined
    and a tag it does not have."""
    name = metric.series + suffix
    labels = _labels_of(name, metric.name)
    unknown = sorted(set(matchers) - set(labels))
    if unknown:
        raise MonitoringError(f"{name} has no label {unknown}; its labels are {list(labels)}: match only those")
    body = ", ".join(f"{label}{matcher}" for label, matcher in matchers.items())
    return f"{name}{{{body}}}" if body else name


def selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """The ``(series, {label: operator + quoted value})`` of every series ``expr`` names: braced
    selectors, then bare names (with no matchers)."""
    braced = [
        (name, {label: f'{op}"{value}"' for label, op, value in _MATCHER.findall(body)})
        for name, body in _SELECTOR.findall(expr)
    ]
    bare = [(name, {}) for name in _BARE_NAME.findall(_NOT_A_NAME.sub(" ", expr)) if name.lower() not in _KEYWORDS]
    return braced + bare


def check_expression(expr: str) -> None:
    """Refuses ``expr`` if it names a series the definitions do not export, matches a label its
    series does not carry, or groups by a label none of its series carries."""
    labels = {name: _labels_of(name, expr) for name in sorted({name for name, _ in selectors(expr)})}
    for name, matchers in selectors(expr):
        unknown = sorted(set(matchers) - set(labels[name]))
        if unknown:
            raise MonitoringError(
                f"{expr!r} matches {unknown} on {name}, whose labels are {list(labels[name])}; match only those"
            )
    carried = {label for series_labels in labels.values() for label in series_labels}
    grouped = {label.strip() for group in _GROUPING.findall(expr) for label in group.split(",") if label.strip()}
    if grouped - carried:
        raise MonitoringError(
            f"{expr!r} groups by {sorted(grouped - carried)}, which none of its series carries "
            f"(they carry {sorted(carried)}); group by those"
        )


def _labels_of(name: str, where: str) -> tuple[str, ...]:
    series = known_series()
    if name not in series:
        raise MonitoringError(
            f"{where!r}: no metric definition exports the series {name!r}; use a MetricDefinition of "
            "rl_data.distributed.metrics.METRICS or rl_data.prompt_feed.metrics.METRICS (renamed or removed?)"
        )
    return series[name]
