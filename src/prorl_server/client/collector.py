"""DapoCollector: DAPO's dynamic sampling on prorl-server groups, asynchronously (ProRL Agent, section 3.4).

DAPO trains only on *informative* groups: those whose rewards are not all equal (reward variance > 0); the
zero-variance groups carry no gradient and are dropped. Done batch by batch (submit a batch of prompts, wait
for all of them, keep the informative ones, repeat until B), the servers idle while a batch's slowest rollout
finishes and the surplus of the last batch is thrown away. The collector instead:

1. keeps `max_groups_in_flight` groups running: as soon as one is decided the next one is submitted;
2. returns from `collect_step()` as soon as it holds `target_groups` informative groups;
3. carries the groups still running over into the next step (their results count there), or, with
   `carry_over=False`, cancels them (`DELETE /groups/{id}`) at the end of the step.

    async with RolloutClient(url) as client:
        prompts = ({"instance": task, "n": 8, "sampling_params": {"temperature": 1.0}} for task in dataset)
        async with DapoCollector(client, prompts, target_groups=32, max_groups_in_flight=48) as collector:
            for step in range(steps):
                report = await collector.collect_step()
                train_on(report.groups)  # 32 GroupResults, each with reward variance > 0

Every `StepReport` counts groups (launched, finished, informative, filtered, failed, carried over, cancelled)
and rollouts (finished, used, filtered, cancelled, wasted), the wall time, the time the collector had fewer
than `max_groups_in_flight` groups running, and, with `status_interval_s`, the idle worker-seconds of the
servers' `idle_stage` pool sampled from `GET /status`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from types import TracebackType
from typing import Any

from prorl_server.client.errors import RolloutServerError
from prorl_server.client.idle_meter import IdleWorkerMeter
from prorl_server.client.resources.groups import GroupRequestLike
from prorl_server.client.rollout_client import RolloutClient
from prorl_server.protocol import GroupRequest, GroupResult, GroupStatus, JobStatus

log = logging.getLogger(__name__)

RequestSource = Callable[[], GroupRequestLike | None] | Iterable[GroupRequestLike]
"""Where the collector's groups come from: a callable returning the next group request (None, or raising
StopIteration, when there are no more), or an iterable of group requests."""

FINISHED_MEMBER = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.TIMEOUT})
"""Member statuses that mean the rollout ran to its end (a cancelled or unfinished member is cancelled work)."""


def reward_variance_positive(group: GroupResult) -> bool:
    """DAPO's filter: a completed group whose selected results' rewards are not all equal."""
    if group.status is not GroupStatus.COMPLETED:
        return False
    rewards = [r.reward for r in group.results if r.reward is not None]
    return len(rewards) >= 2 and max(rewards) > min(rewards)


@dataclass
class StepReport:
    """What one `collect_step()` returned and what it cost.

    Groups are *accounted* in the step that ends them for the trainer: returned (informative), filtered
    (completed, zero variance), failed (fewer than `min_usable` usable members), or cancelled. A group still
    running at the end of a step is *carried over* and accounted in a later step; so is an informative group
    decided after the target was already met (held for the next step).

    Rollouts (members) of the accounted groups: `finished` ran to their end (completed, failed or timed out),
    `used` are the results returned to the trainer, `filtered` the finished ones of zero-variance groups,
    `cancelled` were stopped before their end (first_n redundancy, or the end of the step without carry-over).
    `rollouts_wasted` = finished but not used, plus cancelled; `rollouts_wasted_beyond_filter` leaves out
    the zero-variance groups DAPO drops by design: the waste the scheduling itself causes.
    """

    step: int
    groups: list[GroupResult] = field(default_factory=list)
    exhausted: bool = False
    groups_launched: int = 0
    groups_finished: int = 0
    groups_informative: int = 0
    groups_filtered: int = 0
    groups_failed: int = 0
    groups_carried_in: int = 0
    groups_carried_over: int = 0
    groups_cancelled: int = 0
    rollouts_finished: int = 0
    rollouts_used: int = 0
    rollouts_filtered: int = 0
    rollouts_cancelled: int = 0
    wall_s: float = 0.0
    underfilled_s: float = 0.0
    idle_worker_s: float | None = None
    worker_s: float | None = None

    @property
    def rollouts_wasted(self) -> int:
        """Finished rollouts not returned to the trainer, plus cancelled ones."""
        return self.rollouts_finished - self.rollouts_used + self.rollouts_cancelled

    @property
    def rollouts_wasted_beyond_filter(self) -> int:
        """`rollouts_wasted` without the zero-variance groups' rollouts (which DAPO drops by design)."""
        return self.rollouts_wasted - self.rollouts_filtered

    def figures(self) -> dict[str, Any]:
        """Every count and time (not the groups), for logs and JSON."""
        figures = {k: v for k, v in asdict(self).items() if k != "groups"}
        figures["rollouts_wasted"] = self.rollouts_wasted
        figures["rollouts_wasted_beyond_filter"] = self.rollouts_wasted_beyond_filter
        return figures


class DapoCollector:
    """DAPO's dynamic sampling over prorl-server groups, asynchronously (see the module docstring).

    - `requests`: a callable returning the next group request (a GroupRequest or a dict of its fields;
      None or StopIteration when there are no more), or an iterable of them. A request without `group_id`
      gets `{group_id_prefix}-{k}`.
    - `target_groups` (B): informative groups per `collect_step()`.
    - `max_groups_in_flight` (K): groups kept running; one is submitted as soon as another is decided.
    - `carry_over`: keep the groups running at the end of a step for the next one (default), or cancel them.
    - `is_informative`: the filter (default: completed, and the selected results' rewards not all equal).
    - `ack`: acknowledge the members' job results on the server once their group is accounted (the
      GroupResult keeps them), so they do not pile up in its result store.
    - `status_interval_s`: sample `GET /status` every so many seconds during a step for the idle
      worker-seconds of the servers' `idle_stage` pool (None: not measured).

    Not safe for concurrent `collect_step()` calls. `aclose()` (or `async with`) cancels what still runs.
    """

    def __init__(
        self,
        client: RolloutClient,
        requests: RequestSource,
        *,
        target_groups: int,
        max_groups_in_flight: int,
        carry_over: bool = True,
        is_informative: Callable[[GroupResult], bool] = reward_variance_positive,
        ack: bool = True,
        status_interval_s: float | None = None,
        idle_stage: str = "run",
        group_id_prefix: str | None = None,
    ) -> None:
        if target_groups < 1:
            raise ValueError("target_groups must be at least 1")
        if max_groups_in_flight < 1:
            raise ValueError("max_groups_in_flight must be at least 1")
        self.client = client
        self.target_groups = target_groups
        self.max_groups_in_flight = max_groups_in_flight
        self.carry_over = carry_over
        self.is_informative = is_informative
        self.ack = ack
        self.status_interval_s = status_interval_s
        self.idle_stage = idle_stage
        self.prefix = group_id_prefix or f"dapo-{uuid.uuid4().hex[:12]}"
        self._next = _next_request(requests)
        self._exhausted = False
        self._ids = itertools.count()
        self._running: dict[str, asyncio.Task[GroupResult]] = {}  # in launch order
        self._ready: deque[GroupResult] = deque()  # informative groups beyond a step's target
        self._steps = 0
        self._closed = False

    # public ----------------------------------------------------------------------------------------

    @property
    def running(self) -> list[str]:
        """Ids of the groups in flight."""
        return list(self._running)

    @property
    def exhausted(self) -> bool:
        """True once the request source has no more groups."""
        return self._exhausted

    async def collect_step(self, target: int | None = None) -> StepReport:
        """Return `target` (default `target_groups`) informative groups as soon as they are decided, keeping
        `max_groups_in_flight` groups running meanwhile. Fewer only when the request source ran out and
        nothing runs any more (`exhausted`). A failed server request (after the client's retries) raises
        RolloutServerError; the groups in flight stay tracked."""
        if self._closed:
            raise RuntimeError("this DapoCollector is closed")
        target = self.target_groups if target is None else target
        started = time.monotonic()
        report = StepReport(step=self._steps, groups_carried_in=len(self._running) + len(self._ready))
        self._steps += 1
        accounted: list[GroupResult] = []
        meter = None
        if self.status_interval_s is not None:
            meter = IdleWorkerMeter(self.client, stage=self.idle_stage, interval_s=self.status_interval_s)
            meter.start()
        fill = _FillClock(started, self._underfilled())
        try:
            while self._ready and len(report.groups) < target:
                self._return(self._ready.popleft(), report, accounted)
            while len(report.groups) < target:
                await self._top_up(report, fill)
                if not self._running:
                    break
                done, _ = await asyncio.wait(self._running.values(), return_when=asyncio.FIRST_COMPLETED)
                finished = [(gid, task) for gid, task in self._running.items() if task in done]
                for gid, _ in finished:
                    del self._running[gid]
                fill.mark(time.monotonic(), self._underfilled())
                for _, task in finished:
                    self._classify(task.result(), report, target, accounted)
            if not self.carry_over:
                await self._cancel_running(report, accounted)
        finally:
            fill.mark(time.monotonic(), self._underfilled())
            if meter is not None:
                report.idle_worker_s, report.worker_s = await meter.stop()
            report.exhausted = self._exhausted and not self._running and not self._ready
            report.groups_carried_over = len(self._running) + len(self._ready)
            report.underfilled_s = fill.underfilled_s
            report.wall_s = time.monotonic() - started
            await self._ack(accounted)
        return report

    async def aclose(self) -> StepReport:
        """Cancel the groups still running and drop the informative ones not yet returned; returns what that
        threw away (`groups_cancelled`, and those groups' rollouts). Idempotent."""
        report = StepReport(step=self._steps, groups_carried_in=len(self._running) + len(self._ready))
        if self._closed:
            return report
        self._closed = True
        started = time.monotonic()
        accounted: list[GroupResult] = []
        try:
            while self._ready:
                group = self._ready.popleft()
                report.groups_finished += 1
                self._count_members(group, report)
                accounted.append(group)
            await self._cancel_running(report, accounted)
        finally:
            report.wall_s = time.monotonic() - started
            await self._ack(accounted)
        return report

    async def __aenter__(self) -> DapoCollector:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # internals -------------------------------------------------------------------------------------

    def _underfilled(self) -> bool:
        return len(self._running) < self.max_groups_in_flight

    async def _top_up(self, report: StepReport, fill: _FillClock) -> None:
        """Submit groups until `max_groups_in_flight` run (or the source is exhausted)."""
        requests: list[GroupRequest] = []
        while not self._exhausted and len(self._running) + len(requests) < self.max_groups_in_flight:
            request = self._take()
            if request is not None:
                requests.append(request)
        if not requests:
            return
        outcomes = await asyncio.gather(
            *(self.client.groups.submit(request) for request in requests), return_exceptions=True
        )
        failure: BaseException | None = None
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                failure = failure or outcome
                continue
            report.groups_launched += 1
            self._running[outcome] = asyncio.get_running_loop().create_task(
                self.client.groups.wait(outcome), name=f"prorl-dapo-{outcome}"
            )
        fill.mark(time.monotonic(), self._underfilled())
        if failure is not None:
            raise failure

    def _take(self) -> GroupRequest | None:
        """The next request from the source, with a group id (None once exhausted)."""
        try:
            raw = self._next()
        except StopIteration:
            raw = None
        if raw is None:
            self._exhausted = True
            return None
        request = raw if isinstance(raw, GroupRequest) else GroupRequest.model_validate(dict(raw))
        if request.group_id is None:
            request = request.model_copy(update={"group_id": f"{self.prefix}-{next(self._ids)}"})
        return request

    def _classify(self, group: GroupResult, report: StepReport, target: int, accounted: list[GroupResult]) -> None:
        if self.is_informative(group):
            if len(report.groups) < target:
                self._return(group, report, accounted)
            else:
                self._ready.append(group)  # decided after the target was met: the next step's
            return
        report.groups_finished += 1
        if group.status is GroupStatus.COMPLETED:
            report.groups_filtered += 1
            report.rollouts_filtered += sum(m.status in FINISHED_MEMBER for m in group.members)
        else:
            report.groups_failed += 1
        self._count_members(group, report)
        accounted.append(group)

    def _return(self, group: GroupResult, report: StepReport, accounted: list[GroupResult]) -> None:
        report.groups.append(group)
        report.groups_finished += 1
        report.groups_informative += 1
        report.rollouts_used += len(group.results)
        self._count_members(group, report)
        accounted.append(group)

    @staticmethod
    def _count_members(group: GroupResult, report: StepReport) -> None:
        for member in group.members:
            if member.status in FINISHED_MEMBER:
                report.rollouts_finished += 1
            else:
                report.rollouts_cancelled += 1

    async def _cancel_running(self, report: StepReport, accounted: list[GroupResult]) -> None:
        """Cancel every group in flight (`DELETE /groups/{id}`) and account what they did."""
        running = list(self._running.items())
        self._running.clear()
        for _, task in running:
            task.cancel()
        await asyncio.gather(*(task for _, task in running), return_exceptions=True)
        answers = await asyncio.gather(*(self.client.groups.cancel(gid) for gid, _ in running), return_exceptions=True)
        for (gid, _), answer in zip(running, answers, strict=True):
            report.groups_cancelled += 1
            if isinstance(answer, GroupResult):
                self._count_members(answer, report)
                accounted.append(answer)
            elif isinstance(answer, Exception):
                log.warning("could not cancel group %s: %s", gid, answer)
            else:
                raise answer

    async def _ack(self, groups: list[GroupResult]) -> None:
        """Acknowledge the accounted groups' member results (best effort)."""
        if not self.ack or not groups:
            return
        job_ids = [member.job_id for group in groups for member in group.members]
        try:
            await self.client.jobs.ack(job_ids=job_ids)
        except RolloutServerError as exc:
            log.warning("could not acknowledge %d member results: %s", len(job_ids), exc)


class _FillClock:
    """Time spent with fewer than K groups in flight: `mark(now, underfilled)` at every change."""

    def __init__(self, now: float, underfilled: bool) -> None:
        self.at = now
        self.underfilled = underfilled
        self.underfilled_s = 0.0

    def mark(self, now: float, underfilled: bool) -> None:
        if self.underfilled:
            self.underfilled_s += now - self.at
        self.at = now
        self.underfilled = underfilled


def _next_request(source: RequestSource) -> Callable[[], GroupRequestLike | None]:
    if callable(source):
        return source
    iterator: Iterator[GroupRequestLike] = iter(source)
    return lambda: next(iterator)


def __getattr__(name: str) -> Any:
    """`SyncDapoCollector`, generated with the sync client, is in `prorl_server.client.sync` now."""
    if name == "SyncDapoCollector":
        from prorl_server.client.sync import SyncDapoCollector

        return SyncDapoCollector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
