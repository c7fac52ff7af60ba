"""The skyrl_gym handler: run a skyrl-gym text environment (`BaseTextEnv`) multi-turn, token-exact.

Instance: ``{"data_source": "skyrl_gym", "env_class": "gsm8k_multi_turn", "prompt": [{"role": "user",
"content": "..."}], "reward_spec": {"ground_truth": "42"}, "max_turns": 3}``. INIT makes the environment with
``skyrl_gym.make(env_class, env_config=..., extras=...)`` as SkyRL's generator does (``env_config`` as an
OmegaConf config, ``extras``: every other field of the instance, SkyRL's ``env_extras``) and calls
``env.init(prompt)``. RUN alternates ``ctx.llm.generate()`` and ``env.step(reply.text)``, appending the
step's observations as observation tokens (mask 0), until the step says ``done`` or ``max_turns`` model turns
were taken. EVAL's reward is the sum of the step rewards: SkyRL puts each step's reward on the last token of
its turn, so an episode's return is their sum (a single-step environment: its one reward).

Every call of the environment runs in a thread with ``step_timeout`` seconds; one that raises or runs past it
fails the job (``EnvironmentFailed``, naming the environment and the call), and one that returns the wrong
shape fails it with ``MalformedObservation``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from pydantic import BaseModel, Field

from prorl_handlers.env_adapters import (
    DEFAULT_MAX_TURNS,
    DEFAULT_STEP_TIMEOUT_S,
    MAX_TURNS_CAP,
    ChatMessage,
    EnvAdapterError,
    MalformedObservation,
    StepResult,
    UnknownEnvironment,
    call_env,
    check,
    check_messages,
    known_names,
)
from prorl_handlers.instances import parse_instance
from prorl_server import AgentHandler, JobContext

OWN_FIELDS = frozenset({"data_source", "env_class", "env_config", "prompt", "step_timeout"})
"""The instance fields the handler reads; every other one goes to the environment as SkyRL's env_extras."""


class SkyRLGymTask(BaseModel):
    """The fields of an instance the handler reads."""

    env_class: str = Field(min_length=1)
    prompt: list[ChatMessage] | str = Field(min_length=1)
    env_config: dict[str, Any] = Field(default_factory=dict)
    max_turns: int = Field(default=DEFAULT_MAX_TURNS, ge=1, le=MAX_TURNS_CAP)
    step_timeout: float = Field(default=DEFAULT_STEP_TIMEOUT_S, gt=0, le=3600)

    def messages(self) -> list[dict[str, Any]]:
        if isinstance(self.prompt, str):
            return [{"role": "user", "content": self.prompt}]
        return [m.model_dump() for m in self.prompt]


def make_env(env_class: str, env_config: dict[str, Any], extras: dict[str, Any]) -> Any:
    """`skyrl_gym.make(env_class, env_config=..., extras=...)`, or UnknownEnvironment listing the known ids."""
    try:
        import skyrl_gym
        from omegaconf import OmegaConf
    except ImportError as exc:
        raise EnvAdapterError(
            f"the skyrl_gym handler needs skyrl-gym ({exc}): pip install 'prorl-server[environments]'"
        ) from None
    if env_class not in skyrl_gym.registry:
        raise UnknownEnvironment(
            f"unknown skyrl-gym environment {env_class!r}; registered: {known_names(skyrl_gym.registry)}"
            " (register yours with skyrl_gym.register(id=..., entry_point=...) in the server's process)"
        )
    return skyrl_gym.make(env_class, env_config=OmegaConf.create(env_config), extras=extras)


class SkyRLGymHandler(AgentHandler):
    """INIT: make the env and `env.init(prompt)`; RUN: generate / `env.step` until done or max_turns; EVAL: the
    sum of the step rewards."""

    name = "skyrl_gym"
    instance_model = SkyRLGymTask

    async def init(self, ctx: JobContext) -> None:
        task = parse_instance(SkyRLGymTask, ctx.instance)
        extras = {k: v for k, v in ctx.instance.items() if k not in OWN_FIELDS}
        timeout = task.step_timeout
        name = task.env_class
        env = await call_env(name, "make", make_env, name, task.env_config, extras, timeout=timeout)

        async def close() -> None:
            with contextlib.suppress(EnvAdapterError):  # a failing close must not fail a job that is over
                await call_env(name, "close", env.close, timeout=timeout)

        ctx.on_release(close)
        out = await call_env(name, "init", env.init, task.messages(), timeout=timeout)
        if not (isinstance(out, tuple | list) and len(out) == 2):
            raise MalformedObservation(
                f"environment {name!r} returned a malformed init output: expected (prompt, metadata), "
                f"got {type(out).__name__}"
            )
        ctx.state.update(task=task, env=env, prompt=check_messages(out[0], name, "init", ChatMessage))

    async def run(self, ctx: JobContext) -> None:
        task: SkyRLGymTask = ctx.state["task"]
        env, name = ctx.state["env"], task.env_class
        await ctx.llm.start(ctx.state["prompt"])
        rewards: list[float] = []
        ctx.artifacts.update(env_class=name, step_rewards=rewards, ended="max_turns")
        for turn in range(1, task.max_turns + 1):
            reply = await ctx.llm.generate()
            step = check(
                StepResult,
                await call_env(name, f"step {turn}", env.step, reply.text, timeout=task.step_timeout),
                name,
                f"step {turn}",
            )
            rewards.append(step.reward)
            if step.done:
                ctx.artifacts["ended"] = "done"
                break
            if turn < task.max_turns and step.observations:
                await ctx.llm.add_messages([m.model_dump() for m in step.observations])
        ctx.artifacts["metrics"] = await metrics(env, name, task.step_timeout)

    async def eval(self, ctx: JobContext) -> dict[str, Any]:
        rewards = ctx.artifacts["step_rewards"]
        return {
            "reward": float(sum(rewards)),
            "step_rewards": rewards,
            "turns": len(ctx.trajectory.turns),
            "ended": ctx.artifacts["ended"],
        }


async def metrics(env: Any, name: str, timeout: float) -> dict[str, Any]:
    """The env's `get_metrics()` if it has one and it answers with a dict; else {} (metrics are extras)."""
    get = getattr(env, "get_metrics", None)
    if get is None:
        return {}
    try:
        value = await asyncio.wait_for(asyncio.to_thread(get), timeout)
    except Exception:
        return {}
    if not isinstance(value, dict):
        return {}
    try:
        json.dumps(value)  # they go into the result's artifacts
    except (TypeError, ValueError):
        return {}
    return value
