"""The simulator's latency profile, kept importable here: it lives in `scheduling/latency_profile.py`, which
the server's configuration and placement read without importing the simulator."""

from prorl_server.scheduling.latency_profile import DEFAULT_PROFILE, MAX_POINTS, LatencyProfile

__all__ = ["DEFAULT_PROFILE", "MAX_POINTS", "LatencyProfile"]
