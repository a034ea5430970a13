"""Grafana dashboard and Prometheus alert rules of rl_data, generated from the metric definitions.

:func:`dashboard` and :func:`alert_rules` return plain data (JSON and YAML shapes); ``docs/generate.py``
writes them to ``cluster_configs/monitoring/``. Every query is built from the
:class:`~rl_data.distributed.metrics.MetricDefinition` objects and checked against them
(:mod:`rl_data.monitoring.promql`). Pure: imports neither Ray nor torch.
"""

from rl_data.monitoring.alerts import alert_rules
from rl_data.monitoring.dashboard import dashboard

__all__ = ["alert_rules", "dashboard"]
