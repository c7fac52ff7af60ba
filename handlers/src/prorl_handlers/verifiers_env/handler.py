"""The verifiers handler: run a `verifiers` (0.4, `verifiers.v1`) environment's own episode against the job's
gateway session, token-exact, and score it with the environment's own rewards.

Instance: ``{"data_source": "verifiers", "taskset": "my_taskset", "task": {"prompt": "...", "answer": "4"}}``.
INIT builds the environment as verifiers' env server does: the `EnvConfig` of the taskset (`taskset_config`),
the paired `Env` (`env`, else the taskset's own, else `SingleAgentEnv`) and `env_config`, every role played
by the policy through the in-process `prorl_chat` harness (see `chat.py`) in verifiers' subprocess runtime
with at most `max_turns` model turns; then the task: `task` validated as the taskset's `TaskData`, or the
taskset's `index`-th task. RUN opens the job's gateway session, points verifiers' OpenAI client at it and
runs `env.run_episode(task)` inside `env.serving()`: the environment's `run()` drives the turns, the gateway
records every completion token-exact (the environment's turns are mask 0), and verifiers scores each trace
with the task's `@vf.reward`s and the env's `finalize()`. The trainable roles call the policy by the session's
own model name, the roles the env's `setup()` marks untrainable (a modeled user) by one of their own, as side
calls: the reward's chains are the trainable conversations, and one such conversation is the job's
trajectory. EVAL's reward is the mean of the trainable traces' rewards (a single-agent env: its one trace's
weighted reward sum).

Failures are failed results: an episode or trace that verifiers recorded as failed is `EnvironmentFailed`,
a turn the model cannot be handed or a non-finite reward is `MalformedObservation`, an unknown taskset, env
or harness id is `UnknownEnvironment`, and the episode is bounded by `episode_timeout`.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import itertools
import math
import os
import pkgutil
import sys
import types
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from prorl_handlers.env_adapters import (
    DEFAULT_MAX_TURNS,
    DEFAULT_STEP_TIMEOUT_S,
    MAX_TURNS_CAP,
    EnvAdapterError,
    EnvironmentFailed,
    MalformedObservation,
    UnknownEnvironment,
    call_env,
    describe,
    known_names,
)
from prorl_handlers.instances import parse_instance
from prorl_server import AgentHandler, JobContext

HARNESS_ID = "prorl_chat"
"""The harness id the adapter gives verifiers for `prorl_handlers.verifiers_env.chat`."""
CHAT_HARNESSES = frozenset({HARNESS_ID, "null"})
"""The harnesses a role may pin: verifiers' tool-less `null` is played by `prorl_chat`, its in-process twin."""
DEFAULT_EPISODE_TIMEOUT_S = 600.0
POLICY_MODEL = "policy"
"""The model name the trainable roles call the policy by (the gateway session's own)."""
KEY_VARIABLE = "PRORL_VERIFIERS_KEY_{session}"
"""The environment variable verifiers reads the gateway session's key from (its client takes keys from
variables only), one per session, set for the episode and removed at the job's release."""
INSTALL = "pip install 'prorl-server[verifiers]'"


class VerifiersTask(BaseModel):
    """The fields of an instance the handler reads."""

    taskset: str = Field(min_length=1)
    taskset_config: dict[str, Any] = Field(default_factory=dict)
    env: str = ""
    env_config: dict[str, Any] = Field(default_factory=dict)
    task: dict[str, Any] | None = None
    index: int | None = Field(default=None, ge=0)
    max_turns: int = Field(default=DEFAULT_MAX_TURNS, ge=1, le=MAX_TURNS_CAP)
    step_timeout: float = Field(default=DEFAULT_STEP_TIMEOUT_S, gt=0, le=3600)
    episode_timeout: float = Field(default=DEFAULT_EPISODE_TIMEOUT_S, gt=0, le=86400)

    @field_validator("taskset_config", "env_config")
    @classmethod
    def _no_ids(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "id" in value or "taskset" in value:
            raise ValueError("the ids are the instance's own fields `taskset` and `env`, not config keys")
        return value

    @model_validator(mode="after")
    def _one_task(self) -> VerifiersTask:
        if (self.task is None) == (self.index is None):
            raise ValueError("give exactly one of `task` (the task's data) and `index` (a task of the taskset)")
        return self

    @property
    def name(self) -> str:
        """The environment as the messages name it: `env+taskset`, as verifiers' `env_id` does."""
        return f"{self.env}+{self.taskset}" if self.env else self.taskset


def import_verifiers() -> Any:
    """`verifiers.v1`, with the `prorl_chat` harness made importable by its id; else EnvAdapterError."""
    try:
        import verifiers.v1 as vf

        chat = importlib.import_module("prorl_handlers.verifiers_env.chat")
    except ImportError as exc:
        raise EnvAdapterError(f"the verifiers handler needs verifiers 0.4 ({exc}): {INSTALL}") from None
    sys.modules.setdefault(HARNESS_ID, chat)
    return vf


def _importable(plugin_id: str, group: str) -> bool:
    """Whether verifiers finds the plugin `plugin_id` (as its loader does: `group.<name>`, else `<name>`)."""
    name = plugin_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
    for module in (f"{group}.{name}", name):
        if module in sys.modules:
            return True
        try:
            if importlib.util.find_spec(module) is not None:
                return True
        except (ImportError, ValueError):  # a parent package missing, or a module without a spec
            continue
    return False


def _builtin(group: str) -> list[str]:
    return [info.name for info in pkgutil.iter_modules(importlib.import_module(group).__path__)]


def _check_known(task: VerifiersTask) -> None:
    """UnknownEnvironment for a taskset or env id verifiers would not find, listing its built-in ones."""
    plugin = "an installed package, or a module imported in the server's process, exporting"
    if not _importable(task.taskset, "verifiers.v1.tasksets"):
        raise UnknownEnvironment(
            f"unknown verifiers taskset {task.taskset!r}; built in: {known_names(_builtin('verifiers.v1.tasksets'))}"
            f" (or {plugin} a vf.Taskset subclass in __all__)"
        )
    if task.env and not _importable(task.env, "verifiers.v1.envs"):
        raise UnknownEnvironment(
            f"unknown verifiers env {task.env!r}; built in: {known_names(_builtin('verifiers.v1.envs'))}"
            f" (or {plugin} a vf.Env subclass in __all__)"
        )


def make_env(task: VerifiersTask) -> tuple[Any, frozenset[str]]:
    """The verifiers Env of the instance, every role on `prorl_chat` in the subprocess runtime, and the roles its
    `setup()` marks untrainable (a modeled user, a judge): those call the policy under a model name of their
    own (`side_model(role)`), so the gateway records them as side calls, apart from the reward's conversations
    (blocking: it imports the taskset's module and builds the taskset)."""
    vf = import_verifiers()
    from verifiers.v1.configs.agent import agent_config_fields
    from verifiers.v1.configs.retries import RetryConfig
    from verifiers.v1.runtimes import SubprocessConfig
    from verifiers.v1.utils.loaders import harness_config_type, load_environment, resolve_env_config

    _check_known(task)
    raw = {**task.env_config, "id": task.env, "taskset": {**task.taskset_config, "id": task.taskset}}
    try:
        config = resolve_env_config(raw)
    except ValidationError as exc:
        raise EnvAdapterError(f"verifiers refused the config of {task.name!r}: {describe(exc)}") from None
    chat = harness_config_type(HARNESS_ID)(id=HARNESS_ID)
    roles = {}
    for role, spec in agent_config_fields(config).items():
        if spec.harness is not None and spec.harness.id not in CHAT_HARNESSES:
            raise UnknownEnvironment(
                f"role {role!r} of {task.name!r} pins the harness {spec.harness.id!r}; the verifiers handler plays "
                f"every role with its in-process chat harness: {', '.join(sorted(CHAT_HARNESSES))} or none"
            )
        if spec.model is not None or spec.client is not None:
            raise EnvAdapterError(
                f"role {role!r} of {task.name!r} pins its own model or client; the verifiers handler plays every "
                "role with the policy, through the job's gateway session"
            )
        roles[role] = spec.model_copy(
            update={
                "harness": chat,
                "runtime": SubprocessConfig(),
                "max_turns": spec.max_turns if spec.max_turns is not None else task.max_turns,
                "retries": RetryConfig(),
            }
        )
    config = config.model_copy(update={**roles, "retries": RetryConfig()})
    env = load_environment(config)
    # the standing the env's setup() gives its roles, on stand-ins (what setup() is for: `trainable = False`)
    probe = vf.Agents(config, lambda role, spec: types.SimpleNamespace(trainable=True))
    asyncio.run(env.setup(probe))
    side = frozenset(role for role in roles if not getattr(probe, role).trainable)
    if not side:
        return env, side
    update = {role: roles[role].model_copy(update={"model": side_model(role)}) for role in side}
    return load_environment(config.model_copy(update=update)), side


def side_model(role: str) -> str:
    """The model name an untrainable role calls the policy by: a side call of the job's gateway session."""
    return f"verifiers-{role}"


def make_task(env: Any, task: VerifiersTask) -> Any:
    """The verifiers Task: `task.task` as the taskset's TaskData (as verifiers' env server rebuilds a task),
    or the taskset's `task.index`-th task (blocking: it runs the taskset's `load()` that far)."""
    if task.task is not None:
        task_cls = type(env.taskset).task_type()
        data_cls = task_cls.data_type()
        try:
            data = data_cls.model_validate(task.task)
        except ValidationError as exc:
            raise EnvAdapterError(
                f"the instance's `task` is no {data_cls.__name__} of {task.name!r}: {describe(exc)}"
            ) from None
        return task_cls(data, env.config.taskset.task)
    assert task.index is not None
    found = list(itertools.islice(iter(env.taskset), task.index, task.index + 1))
    if not found:
        raise EnvAdapterError(f"taskset {task.taskset!r} has no task {task.index} (it has fewer)")
    return found[0]


class VerifiersHandler(AgentHandler):
    """INIT: the verifiers Env and Task; RUN: the env's own episode on the job's gateway session; EVAL: the
    trainable traces' rewards."""

    name = "verifiers"
    instance_model = VerifiersTask

    async def init(self, ctx: JobContext) -> None:
        task = parse_instance(VerifiersTask, ctx.instance)
        env, side = await call_env(task.name, "load", make_env, task, timeout=task.step_timeout)
        vf_task = await call_env(task.name, "task", make_task, env, task, timeout=task.step_timeout)
        ctx.state.update(task=task, env=env, side=side, vf_task=vf_task)

    async def run(self, ctx: JobContext) -> None:
        task: VerifiersTask = ctx.state["task"]
        from verifiers.v1.clients import EvalClientConfig, ModelContext

        from prorl_handlers.verifiers_env.chat import WATCH, Watch

        # the trainable roles' conversations are the reward's chains; the untrainable ones are side calls
        access = await ctx.gateway_session(
            model=POLICY_MODEL, accept_any_model=bool(ctx.state["side"]), reward_chains="agents"
        )
        variable = KEY_VARIABLE.format(session=access.session_id)
        os.environ[variable] = access.api_key
        ctx.on_release(lambda: os.environ.pop(variable, None))
        model = ModelContext(
            model=access.model, client=EvalClientConfig(base_url=access.base_url, api_key_var=variable)
        )
        watch = Watch(task.name)
        token = WATCH.set(watch)
        try:
            async with asyncio.timeout(task.episode_timeout):
                episode = await _episode(ctx.state["env"], ctx.state["vf_task"], model, task.name)
        except TimeoutError:
            raise EnvironmentFailed(
                f"environment {task.name!r} episode: no end within {task.episode_timeout:g} s"
            ) from None
        finally:
            WATCH.reset(token)
        if watch.failures:
            raise watch.failures[0]
        traces = [_trace_summary(trace, task.name) for trace in episode.traces]
        ctx.artifacts["verifiers"] = {"env_id": episode.env.id, "episode_id": episode.id, "traces": traces}
        _raise_failure(episode, task.name)

    async def eval(self, ctx: JobContext) -> dict[str, Any]:
        traces = ctx.artifacts["verifiers"]["traces"]
        trained = [t["reward"] for t in traces if t["trainable"]]
        return {
            "reward": sum(trained) / len(trained) if trained else 0.0,
            "traces": traces,
            "turns": sum(t["turns"] for t in traces),
        }


async def _episode(env: Any, vf_task: Any, model: Any, name: str) -> Any:
    """`env.run_episode(vf_task)` inside `env.serving()`; what escapes verifiers' own boundaries is
    EnvironmentFailed."""
    try:
        async with env.serving():
            return await env.run_episode(vf_task, model)
    except EnvAdapterError:
        raise
    except Exception as exc:
        raise EnvironmentFailed(f"environment {name!r} episode raised {type(exc).__name__}: {exc}") from exc


def _trace_summary(trace: Any, name: str) -> dict[str, Any]:
    """One trace's outcome for the result: who played it, its rewards (score x weight) and metrics, why it
    stopped; MalformedObservation for a reward or metric that is not a finite number."""
    rewards = {key: r.value for key, r in trace.rewards.items() if r is not None}
    metrics = {key: value for key, value in trace.metrics.items() if value is not None}
    for kind, values in (("reward", rewards), ("metric", metrics)):
        for key, value in values.items():
            if not math.isfinite(value):
                raise MalformedObservation(f"environment {name!r} returned a non-finite {kind} {key!r}: {value}")
    return {
        "agent": trace.agent.name if trace.agent is not None else "",
        "trainable": trace.agent.trainable if trace.agent is not None else True,
        "reward": float(sum(rewards.values())),
        "rewards": rewards,
        "metrics": metrics,
        "stop_condition": trace.stop_condition,
        "turns": trace.num_turns,
    }


def _raise_failure(episode: Any, name: str) -> None:
    """EnvironmentFailed for the first error verifiers recorded on the episode or a trace (an env or task hook
    that raised, a reward function that crashed, a harness turn that failed)."""
    errors = [*episode.errors, *(error for trace in episode.traces for error in trace.errors)]
    if errors:
        first = errors[0]
        raise EnvironmentFailed(f"environment {name!r} episode failed: {first.type}: {first.message}")
    if not episode.ok:
        raise EnvironmentFailed(f"environment {name!r} episode failed (verifiers recorded no error)")
