"""Observability: the server's Prometheus metrics and the recent activity its dashboard shows."""

from prorl_server.observability.activity import RecentActivity
from prorl_server.observability.metrics import ServerMetrics

__all__ = ["RecentActivity", "ServerMetrics"]
