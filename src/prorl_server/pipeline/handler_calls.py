"""Calling handler methods that may be async or sync, and reading what EVAL returned."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

from prorl_server.handlers import AgentHandler


def overrides(handler: AgentHandler, method: str) -> bool:
    """True when the handler's class replaces AgentHandler's default `method`."""
    return getattr(type(handler), method) is not getattr(AgentHandler, method)


async def call_handler(fn: Callable[..., Any], *args: Any, executor: concurrent.futures.Executor | None) -> Any:
    """Await `fn(*args)` if it is async; otherwise run it on `executor` (and await what it returns
    if that is awaitable)."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    loop = asyncio.get_running_loop()
    outcome = await loop.run_in_executor(executor, functools.partial(fn, *args))
    if inspect.isawaitable(outcome):
        outcome = await outcome
    return outcome


def parse_eval_outcome(value: Any) -> tuple[float, dict[str, Any]]:
    """EVAL's return value -> (reward, details). Accepts a number or a dict with a `reward` key."""
    if isinstance(value, dict):
        details = dict(value)
        if "reward" not in details:
            raise ValueError(f"eval() returned a dict without a 'reward' key (keys: {sorted(details)})")
        reward = details.pop("reward")
    else:
        reward, details = value, {}
    if isinstance(reward, bool):
        reward = float(reward)
    if not isinstance(reward, int | float):
        raise TypeError(f"eval() must return a float reward or a dict with 'reward', got {type(reward).__name__}")
    reward = float(reward)
    if not math.isfinite(reward):
        raise ValueError(f"eval() returned a non-finite reward ({reward})")
    return reward, details
