"""Run an evaluation: read the tasks file, run every instance `k` times on a server, score each sample."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from tqdm.auto import tqdm

from prorl_server.client import RetryPolicy, RolloutClient, RolloutServerError
from prorl_server.evaluation.errors import EvalError
from prorl_server.evaluation.report import Sample
from prorl_server.protocol import JobResult, JobStatus, ProcessRequest

Task = tuple[int, dict[str, Any]]
"""An instance and its line number in the tasks file (from 1)."""


def load_tasks(path: Path) -> list[Task]:
    """The instances of a JSONL file, one JSON object with a string `data_source` a line (blank lines skipped);
    EvalError naming the line of the first bad one, or for a missing or empty file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise EvalError(f"cannot read the tasks file {path}: {exc.strerror or exc}") from None
    tasks = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            instance = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalError(f"{path}:{number}: not JSON: {exc.msg}") from None
        if not isinstance(instance, dict) or not isinstance(instance.get("data_source"), str):
            raise EvalError(f"{path}:{number}: not a JSON object with a string data_source")
        tasks.append((number, instance))
    if not tasks:
        raise EvalError(f"{path}: no task instances")
    return tasks


def score(line: int, source: str, result: JobResult, pass_threshold: float) -> Sample:
    """A finished job as a sample: a job that did not complete scores 0 and does not pass."""
    completed = result.status is JobStatus.COMPLETED
    reward = float(result.reward or 0.0) if completed else 0.0
    mask = result.trajectory.response_mask
    tokens = sum(mask) if mask else len(result.trajectory.response_ids)
    return Sample(line, source, reward, completed and reward >= pass_threshold, not completed, tokens)


async def evaluate(
    server: str,
    tasks: list[Task],
    *,
    k: int,
    pass_threshold: float,
    concurrency: int,
    api_key: str | None = None,
    sampling_params: dict[str, Any] | None = None,
    agent_config: dict[str, Any] | None = None,
    timeout: float | None = None,
    progress: bool = True,
) -> list[Sample]:
    """Run each task `k` times on `server` (at most `concurrency` jobs at once, each its own job id) and score
    the samples. EvalError when the server cannot be reached or has no handler for a task's data_source."""
    requests = _requests(tasks, k, sampling_params or {}, agent_config or {}, timeout)
    async with RolloutClient(server, api_key=api_key, retry=RetryPolicy(attempts=3, budget_s=10.0)) as client:
        await _check_server(client, tasks)
        slots = asyncio.Semaphore(concurrency)

        async def one(line: int, request: ProcessRequest) -> Sample:
            async with slots:
                result = await client.jobs.process(request)
            bar.update(1)
            return score(line, request.instance["data_source"], result, pass_threshold)

        with tqdm(total=len(tasks) * k, unit="sample", desc="eval", disable=None if progress else True) as bar:
            try:
                async with asyncio.TaskGroup() as group:
                    jobs = [group.create_task(one(line, request)) for line, request in requests]
            except* RolloutServerError as errors:
                raise EvalError(f"a job failed at the server: {errors.exceptions[0]}") from None
            return [job.result() for job in jobs]


def _requests(
    tasks: list[Task], k: int, sampling_params: dict[str, Any], agent_config: dict[str, Any], timeout: float | None
) -> list[tuple[int, ProcessRequest]]:
    """`k` jobs of each task, each with a job id of its own; EvalError naming the line of an invalid one."""
    run = uuid.uuid4().hex[:12]
    requests = []
    for line, instance in tasks:
        for i in range(k):
            try:
                request = ProcessRequest(
                    instance=instance,
                    sampling_params=sampling_params,
                    agent_config=agent_config,
                    job_id=f"eval-{run}-{line}-{i}",
                    timeout=timeout,
                )
            except ValidationError as exc:
                error = exc.errors()[0]
                where = ".".join(str(part) for part in error["loc"])
                raise EvalError(f"line {line}: not a valid job: {where}: {error['msg']}") from None
            requests.append((line, request))
    return requests


async def _check_server(client: RolloutClient, tasks: list[Task]) -> None:
    """EvalError unless the server answers and has a loaded handler for every task's data_source."""
    try:
        handlers = {h.data_source: h for h in await client.handlers()}
    except RolloutServerError as exc:
        raise EvalError(f"the server {client.servers[0]} did not answer: {exc}") from None
    for line, instance in tasks:
        handler = handlers.get(instance["data_source"])
        if handler is None or handler.error:
            why = "has no handler for it" if handler is None else f"could not load its handler: {handler.error}"
            raise EvalError(f"line {line}: data_source {instance['data_source']!r}: the server {why}")
