"""TRL's `GRPOTrainer` with prorl-server as its rollout source (TRL's experimental `rollout_func` hook).

    rollout = ProrlRollout(client, instances, prompt_of=lambda inst: inst["question"],
                           weight_sync=CheckpointSync(client, Path("/dev/shm/ckpt")))
    trainer = GRPOTrainer(model=policy, reward_funcs=server_reward, train_dataset=rollout.dataset(),
                          args=GRPOConfig(...), processing_class=tokenizer, rollout_func=rollout)

TRL hands `rollout_func(prompts, trainer)` the prompts of one generation batch, each repeated
`num_generations` times in a row. Every run of equal prompts becomes one `POST /groups` of that many members,
so the server's groups, sandboxes, multi-turn tools and token-exact ids serve TRL: the answer gives TRL the
engine's prompt ids, the response ids (model and observation tokens), their logprobs, `env_mask` (TRL's
mask of model tokens: observation tokens never enter its loss) and the server's reward, which
`server_reward` passes on as TRL's reward function. Before the rollouts of a new optimizer step, the
trainer's weights are pushed to the engines (`CheckpointSync`), so every step samples from the current policy
under weight version `first_version + global_step`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from prorl_server.client import SyncRolloutClient
from prorl_server.protocol import GroupResult, JobResult, JobStatus
from prorl_server.training.weights import CheckpointSync

REWARD_FIELD = "prorl_reward"


def prompt_key(prompt: str | Sequence[Mapping[str, Any]]) -> str:
    """The key an instance is found under: a text prompt itself, or a conversation's JSON."""
    return prompt if isinstance(prompt, str) else json.dumps(list(prompt), sort_keys=True)


def server_reward(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    """TRL reward function: the reward prorl-server's EVAL gave each rollout."""
    return [float(r) for r in kwargs[REWARD_FIELD]]


class ProrlRollout:
    """A `rollout_func` for TRL's GRPOTrainer that runs each group of generations as a prorl-server group."""

    def __init__(
        self,
        client: SyncRolloutClient,
        instances: Iterable[Mapping[str, Any]],
        *,
        prompt_of: Callable[[Mapping[str, Any]], str],
        sampling_params: Mapping[str, Any] | None = None,
        agent_config: Mapping[str, Any] | None = None,
        weight_sync: CheckpointSync | None = None,
        group_timeout_s: float = 600.0,
    ) -> None:
        self.client = client
        self.sampling_params = dict(sampling_params or {"temperature": 1.0})
        self.agent_config = dict(agent_config or {})
        self.weight_sync = weight_sync
        self.group_timeout_s = group_timeout_s
        self._instances: dict[str, dict[str, Any]] = {}
        self._prompts: list[list[dict[str, str]]] = []
        for instance in instances:
            prompt = [{"role": "user", "content": prompt_of(instance)}]
            key = prompt_key(prompt)
            if key in self._instances:
                raise ValueError(f"two instances have the same prompt: {prompt[0]['content']!r}")
            self._instances[key] = dict(instance)
            self._prompts.append(prompt)
        if not self._instances:
            raise ValueError("no instances")
        self.first_version = self._current_version()
        self.synced_step = 0
        self.pushes: list[float] = []  # seconds of each weight push

    def dataset(self) -> Any:
        """The instances as a `datasets.Dataset` with TRL's conversational `prompt` column."""
        from datasets import Dataset

        return Dataset.from_list([{"prompt": prompt} for prompt in self._prompts])

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        """Push the weights if the trainer stepped since the last push, then run the prompts' groups."""
        step = int(trainer.state.global_step)
        if self.weight_sync is not None and step > self.synced_step:
            model = trainer.accelerator.unwrap_model(trainer.model)
            timing = self.weight_sync.push(model, self.first_version + step)
            self.pushes.append(timing.total_s)
            self.synced_step = step
        results = self.rollouts(prompts)
        return {
            "prompt_ids": [r.trajectory.prompt_ids for r in results],
            "completion_ids": [r.trajectory.response_ids for r in results],
            "logprobs": [r.trajectory.response_logprobs for r in results],
            "env_mask": [r.trajectory.response_mask for r in results],
            REWARD_FIELD: [r.reward or 0.0 for r in results],
        }

    def rollouts(self, prompts: Sequence[str | Sequence[Mapping[str, Any]]]) -> list[JobResult]:
        """One result per prompt, in order: each run of equal prompts is one group."""
        runs: list[tuple[str, int]] = []
        for prompt in prompts:
            key = prompt_key(prompt)
            if key not in self._instances:
                raise KeyError(f"no instance for the prompt {prompt!r}: build the dataset with ProrlRollout.dataset()")
            if runs and runs[-1][0] == key:
                runs[-1] = (key, runs[-1][1] + 1)
            else:
                runs.append((key, 1))
        group_ids = [
            self.client.groups.submit(
                {
                    "instance": self._instances[key],
                    "n": count,
                    "sampling_params": self.sampling_params,
                    "agent_config": self.agent_config,
                }
            )
            for key, count in runs
        ]
        results: list[JobResult] = []
        for group_id, (_, count) in zip(group_ids, runs, strict=True):
            group = self.client.groups.wait(group_id, timeout=self.group_timeout_s)
            results.extend(self._members(group, count))
        return results

    def _members(self, group: GroupResult, count: int) -> list[JobResult]:
        """The group's `count` results: the selected ones, then (for a partial group) failed members that
        still sampled something, with reward 0."""
        chosen = [r for r in group.results if r.trajectory.response_ids]
        for member in group.members:
            if len(chosen) >= count:
                break
            if member.selected:
                continue
            result = self.client.jobs.get(member.job_id).result
            if result is not None and result.trajectory.response_ids:
                chosen.append(result.model_copy(update={"reward": 0.0}))
        if len(chosen) < count:
            errors = sorted({m.status.value for m in group.members if m.status is not JobStatus.COMPLETED})
            raise RuntimeError(
                f"group {group.group_id} gave {len(chosen)} of the {count} rollouts TRL needs "
                f"(member statuses other than completed: {errors or 'none'})"
            )
        return chosen[:count]

    def _current_version(self) -> int:
        """The highest integer weight version the servers have (0 when none), where pushes count on from."""
        versions = [s.version for s in self.client.weights.status().values()]
        return max((v for v in versions if isinstance(v, int)), default=0)
