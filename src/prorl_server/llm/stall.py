"""When a backend request counts as stalled: a timeout from what was asked for and how fast the backend is.

vLLM answers a non-streamed completion only when it is done, so a hung backend looks like a slow one. A
request is declared stalled when it has taken several times longer than the backend's measured speed
needs for `max_tokens`: `max(STALL_FLOOR_S, STALL_SAFETY_FACTOR * max_tokens / tokens_per_s)`. The speed
is an exponentially weighted moving average of output tokens per second of whole requests (queueing and
prefill included, so it errs slow), starting from a deliberately slow prior.
"""

from __future__ import annotations

PRIOR_TOKENS_PER_S = 10.0  # assumed before a backend has finished a request worth measuring
STALL_SAFETY_FACTOR = 4.0
STALL_FLOOR_S = 60.0  # no request is called stalled sooner; also the timeout of tokenize/models calls
EWMA_WEIGHT = 0.2
MIN_SAMPLE_TOKENS = 8  # shorter completions are mostly fixed latency and say little about speed


def updated_speed(tokens_per_s: float | None, output_tokens: int, seconds: float) -> float | None:
    """The speed estimate after a completion of `output_tokens` that took `seconds`."""
    if output_tokens < MIN_SAMPLE_TOKENS or seconds <= 0:
        return tokens_per_s
    current = PRIOR_TOKENS_PER_S if tokens_per_s is None else tokens_per_s
    return current + EWMA_WEIGHT * (output_tokens / seconds - current)


def derived_stall_timeout_s(max_new_tokens: int, tokens_per_s: float | None) -> float:
    """Seconds after which a completion of at most `max_new_tokens` counts as stalled."""
    speed = PRIOR_TOKENS_PER_S if tokens_per_s is None else tokens_per_s
    return max(STALL_FLOOR_S, STALL_SAFETY_FACTOR * max_new_tokens / speed)
