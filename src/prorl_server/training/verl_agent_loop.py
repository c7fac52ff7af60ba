"""verl's agent loop with prorl-server as the rollout: each sample (or each GRPO group) runs on the server.

Imported only in verl's environment (`scripts/setup-verl.sh`); the server never imports it. In a verl run,
an agent loop config file (`actor_rollout_ref.rollout.agent.agent_loop_config_path`) names it:

    - name: prorl_server
      _target_: prorl_server.training.verl_agent_loop.ProrlServerAgentLoop
      server_url: http://127.0.0.1:8000      # else $PRORL_SERVER_URL

and `actor_rollout_ref.rollout.agent.default_agent_loop=prorl_server` sends every sample to it (or a
dataset's `agent_name` column, per sample). verl instantiates the loop once per sample and awaits `run`:

- the task instance is the sample's `extra_info["instance"]` (a dict, the server's instance) with its
  `data_source` defaulting to the sample's `data_source` column; a sample without one sends
  `{"data_source": ..., "prompt": raw_prompt, "reward_model": ..., "extra_info": ...}`.
- samples of one `uid` (verl repeats each prompt `rollout.n` times under one uid) that reach the loop
  within `group_window_s` of each other go to the server as one `POST /groups` of that many members; a
  lone sample is a group of one.
- the result becomes verl's own `AgentLoopOutput`: the engine's prompt and response ids, the loss mask,
  the engine's logprobs, the server's reward (`reward_score`, so verl's reward step is skipped), the number
  of messages, and in `extra_fields` the job id, group id, status and weight versions.
- a sample whose `data_source` the server has no handler for raises `UnknownTaskSource`, naming it.
- a member that did not complete (failed, timeout, stale, cancelled) is kept, so the batch keeps its shape:
  reward 0.0 and its response mask all zeros (no token of it enters the loss); its status and error are
  in `extra_fields` (`prorl_status`, `prorl_error`). `fail_on_error: true` raises `RolloutFailed` instead.

Weight sync: `server_weight_update(client, version, push)` pauses the servers' dispatching, awaits `push()`
(verl's own `CheckpointEngineManager.update_weights`, which writes the actor's weights into the engines),
then sets the servers' weight version and resumes; see docs/trainers.md.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from prorl_server.client import RolloutClient, RolloutServerError
from prorl_server.protocol import GroupResult, JobResult, JobStatus
from prorl_server.training.verl_errors import RolloutFailed, UnknownTaskSource, VerlRolloutError

SERVER_URL_ENV = "PRORL_SERVER_URL"

__all__ = [
    "ProrlServerAgentLoop",
    "RolloutFailed",
    "UnknownTaskSource",
    "VerlRolloutError",
    "agent_loop_output",
    "close_clients",
    "instance_of",
    "server_weight_update",
]


def to_jsonable(value: Any) -> Any:
    """A dataset field as JSON: numpy arrays and scalars as lists and numbers, mappings as dicts."""
    if hasattr(value, "tolist"):
        return to_jsonable(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return value


def instance_of(sample: Mapping[str, Any]) -> dict[str, Any]:
    """The server's task instance for one verl sample (see the module docstring)."""
    extra = to_jsonable(sample.get("extra_info") or {})
    data_source = sample.get("data_source")
    if isinstance(extra.get("instance"), dict):
        instance = dict(extra["instance"])
    else:
        instance = {
            "prompt": to_jsonable(sample.get("raw_prompt")),
            "reward_model": to_jsonable(sample.get("reward_model")),
            "extra_info": extra,
        }
    if data_source is not None:
        instance.setdefault("data_source", str(data_source))
    if "data_source" not in instance:
        raise VerlRolloutError("the sample has no data_source (neither a column nor extra_info['instance'])")
    return instance


def agent_loop_output(result: JobResult, *, group_id: str | None, prompt_length: int, response_length: int):
    """verl's AgentLoopOutput of one result (the response cut at `response_length`, as verl's own loops do)."""
    traj = result.trajectory
    completed = result.status is JobStatus.COMPLETED
    mask = list(traj.response_mask) if completed else [0] * len(traj.response_ids)
    if len(traj.prompt_ids) > prompt_length:
        raise VerlRolloutError(
            f"job {result.job_id}: the prompt has {len(traj.prompt_ids)} tokens, more than "
            f"rollout.prompt_length={prompt_length} (raise it: cutting the prompt would change the rollout)"
        )
    return AgentLoopOutput(
        prompt_ids=list(traj.prompt_ids),
        response_ids=list(traj.response_ids[:response_length]),
        response_mask=mask[:response_length],
        response_logprobs=list(traj.response_logprobs[:response_length]),
        reward_score=float(result.reward) if completed and result.reward is not None else 0.0,
        num_turns=len(traj.messages),
        metrics=AgentLoopMetrics(generate_sequences=result.timing.llm_s, tool_calls=result.timing.tool_s),
        extra_fields={
            "turn_scores": [],
            "tool_rewards": [],
            "prorl_job_id": result.job_id,
            "prorl_group_id": group_id,
            "prorl_status": result.status.value,
            "prorl_error": result.error.message if result.error is not None else None,
            "prorl_weight_versions": list(traj.weight_versions),
        },
    )


class _GroupBatcher:
    """Collects the samples of one uid that arrive within a window and runs them as one server group."""

    def __init__(self, client: RolloutClient, window_s: float, timeout_s: float) -> None:
        self.client = client
        self.window_s = window_s
        self.timeout_s = timeout_s
        self._open: dict[str, list[asyncio.Future]] = {}
        self._tasks: set[asyncio.Task] = set()

    async def run(self, key: str, instance: dict[str, Any], sampling_params: dict, agent_config: dict):
        """This sample's (result, group id)."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        waiting = self._open.get(key)
        if waiting is None:
            self._open[key] = [future]
            task = asyncio.get_running_loop().create_task(self._launch(key, instance, sampling_params, agent_config))
            self._tasks.add(task)  # held until done: the loop keeps only a weak reference
            task.add_done_callback(self._tasks.discard)
        else:
            waiting.append(future)
        return await future

    async def _launch(self, key: str, instance: dict, sampling_params: dict, agent_config: dict) -> None:
        await asyncio.sleep(self.window_s)
        futures = self._open.pop(key)
        try:
            body = {"instance": instance, "n": len(futures), "sampling_params": sampling_params}
            if agent_config:
                body["agent_config"] = agent_config
            try:
                group_id = await self.client.groups.submit(body)
            except RolloutServerError as exc:
                if exc.status_code == 400 and "data_source" in exc.detail:
                    raise UnknownTaskSource(instance["data_source"], exc.detail) from exc
                raise
            group = await self.client.groups.wait(group_id, timeout=self.timeout_s)
            results = await self._members(group, len(futures))
        except Exception as exc:
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:  # cancelled (the worker's loop is closing): so are its samples
            for future in futures:
                future.cancel()
            raise
        for future, result in zip(futures, results, strict=True):
            future.set_result((result, group.group_id))

    async def _members(self, group: GroupResult, count: int) -> list[JobResult]:
        """`count` results: the selected ones, then the unselected members' (failed ones included)."""
        chosen = list(group.results)
        taken = {r.job_id for r in chosen}
        for member in group.members:
            if len(chosen) >= count:
                break
            if member.job_id in taken:
                continue
            answer = await self.client.jobs.get(member.job_id)
            if answer.result is not None:
                chosen.append(answer.result)
        if len(chosen) < count:
            raise VerlRolloutError(f"group {group.group_id} ended with {len(chosen)} of its {count} results")
        return chosen[:count]


_batchers: dict[tuple[int, str], _GroupBatcher] = {}
"""(id of the event loop, server URL) -> its batcher, so the loops of one verl worker share a client."""


def _batcher(url: str, window_s: float, timeout_s: float) -> _GroupBatcher:
    key = (id(asyncio.get_running_loop()), url)
    batcher = _batchers.get(key)
    if batcher is None:
        batcher = _batchers[key] = _GroupBatcher(RolloutClient(url), window_s, timeout_s)
    return batcher


async def close_clients() -> None:
    """Close the clients the agent loops of this event loop opened (at the end of a run or a test)."""
    loop_id = id(asyncio.get_running_loop())
    for key in [k for k in _batchers if k[0] == loop_id]:
        await _batchers.pop(key).client.aclose()


SAMPLING_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty")
"""The sampling parameters of verl's that go to the server (verl's `logprobs` flag does not: the server
always returns the engine's logprobs)."""


@register("prorl_server")
class ProrlServerAgentLoop(AgentLoopBase):
    """verl agent loop that runs each sample on a prorl-server (see the module docstring)."""

    def __init__(
        self,
        *args: Any,
        server_url: str | None = None,
        group_window_s: float = 0.05,
        timeout_s: float = 3600.0,
        agent_config: Mapping[str, Any] | None = None,
        fail_on_error: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        url = server_url or os.environ.get(SERVER_URL_ENV)
        if not url:
            raise VerlRolloutError(f"no prorl-server URL: give the agent loop server_url, or set ${SERVER_URL_ENV}")
        self.server_url = str(url)
        self.group_window_s = float(group_window_s)
        self.timeout_s = float(timeout_s)
        self.agent_config = to_jsonable(dict(agent_config or {}))
        self.fail_on_error = bool(fail_on_error)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        instance = instance_of(kwargs)
        params = {k: sampling_params[k] for k in SAMPLING_KEYS if sampling_params.get(k) is not None}
        params["max_tokens"] = int(self.rollout_config.response_length)
        key = str(kwargs.get("uid", id(self)))
        batcher = _batcher(self.server_url, self.group_window_s, self.timeout_s)
        result, group_id = await batcher.run(key, instance, params, self.agent_config)
        if self.fail_on_error and result.status is not JobStatus.COMPLETED:
            raise RolloutFailed(f"job {result.job_id} ended {result.status.value}: {result.error}")
        return agent_loop_output(
            result,
            group_id=group_id,
            prompt_length=int(self.rollout_config.prompt_length),
            response_length=int(self.rollout_config.response_length),
        )


async def server_weight_update(client: RolloutClient, version: str | int, push: Callable[[], Awaitable[Any]]) -> Any:
    """Pause every server's dispatching, await `push()` (the trainer writing its weights into the engines),
    set the servers' weight version to `version`, and resume; on an error in `push` the servers resume on
    their previous version. Returns what `push` returned."""
    await client.weights.pause()
    try:
        pushed = await push()
    except BaseException:
        await client.weights.resume()
        raise
    await client.weights.update(version)
    await client.weights.resume()
    return pushed
