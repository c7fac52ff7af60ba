"""Waiting for a condition in tests, with a message that says what did not happen."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> float:
    """Poll `condition()` until it is true; returns the seconds it took. Fails with `what` after `timeout`."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"{what} within {timeout} s"
        time.sleep(interval)
    return time.monotonic() - started
