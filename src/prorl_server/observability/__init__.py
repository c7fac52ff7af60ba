"""Observability: the server's Prometheus metrics, the recent activity its dashboard shows, and its status
and health report."""

from prorl_server.observability.activity import RecentActivity
from prorl_server.observability.health import problems, status_report
from prorl_server.observability.metrics import ServerMetrics

__all__ = ["RecentActivity", "ServerMetrics", "problems", "status_report"]
