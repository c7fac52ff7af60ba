"""Observability: the server's Prometheus metrics, the recent activity its dashboard shows, and its status
and health report."""

from prorl_server.observability.activity import BUCKET_S, JobSummary, RecentActivity, ThroughputPoint
from prorl_server.observability.health import problems, status_report
from prorl_server.observability.metrics import ServerMetrics

__all__ = ["BUCKET_S", "JobSummary", "RecentActivity", "ServerMetrics", "ThroughputPoint", "problems", "status_report"]
