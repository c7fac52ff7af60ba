"""Groups: redundant rollouts of one instance, of which `n` usable results are kept (see protocol/groups.py).

A GroupRunner lives on the API's event loop. `start()` submits the members through `Orchestrator.submit`
(so each is an ordinary job: stored, streamed by `GET /jobs`, cancellable) and spawns one task per group
that awaits the members' `Job.wait()`. With `first_n` (and a tail-pruned adaptive `dual_end` group), the
task cancels the members still running once `n` are usable (through `Orchestrator.cancel`, which releases
their sandboxes and closes their LLM requests); with `dual_end` it waits for every member. A member that
fails, times out or is cancelled is simply not usable: it never blocks the group. Every decided group's
usable response lengths feed the runner's LengthHistory, from which `adaptive` groups get their size.

Refills: a member that failed for an infrastructure reason (`refill_reason`, pipeline/refill.py) is launched
again as a new member (the next index) while the group needs it (`Group.needs_member`), the group is not
cancelled or stopping, that member's chain of refills is under `group_refill_attempts` and the group's
refills under `group_max_refills`; so a refill loop always ends. A refill's bounded staleness also counts
from the weight versions the group's finished members were sampled under (`Group.sampled_versions`).

Initialise once, fork N: for a handler with `fork_after_init`, on a runtime that forks, the members (refills
too) share one GroupFork (pipeline/fork.py): INIT runs once and each member starts from a copy-on-write fork
of the sandbox it initialised; the group's snapshots are removed when the group ends (`GroupFork.aclose`).

Finished groups are kept for the server's result retention (`result_retention_s`, counted from when the
group finished) and at most `MAX_FINISHED_GROUPS` of them (the oldest go first); running groups are always
kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable

from prorl_server.handlers import HandlerLoadError, UnknownDataSource
from prorl_server.pipeline.admission import FinishedJob, check_instance
from prorl_server.pipeline.errors import DuplicateJob, SubmissionError
from prorl_server.pipeline.fork import GroupFork
from prorl_server.pipeline.job import Job
from prorl_server.pipeline.orchestrator import Orchestrator
from prorl_server.pipeline.redundancy import LengthHistory
from prorl_server.pipeline.refill import refill_reason
from prorl_server.protocol import (
    GroupMember,
    GroupRefill,
    GroupRequest,
    GroupResult,
    GroupStatus,
    JobResult,
    JobStatus,
    MemberRole,
    ProcessRequest,
    Selection,
)

log = logging.getLogger(__name__)

MAX_FINISHED_GROUPS = 10_000
"""Finished groups kept at most (the oldest are dropped first)."""


class DuplicateGroup(DuplicateJob):
    """A group id already used by a different request. HTTP 409."""


def _digest(value: object) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def group_digest(request: GroupRequest) -> str:
    """A digest of everything a group request asks for (key order does not matter)."""
    return _digest(request.model_dump(mode="json"))


def prompt_key(request: GroupRequest) -> str:
    """The prompt's identity in the length history: `adaptive.prompt_key`, else a digest of the instance."""
    if request.adaptive is not None and request.adaptive.prompt_key is not None:
        return request.adaptive.prompt_key
    return _digest(request.instance)


def member_request(request: GroupRequest, group_id: str, index: int) -> ProcessRequest:
    """The job request of member `index`: the group's instance and parameters, job id `{group_id}:{index}`,
    and an integer `seed` of the sampling parameters shifted by `index`."""
    sampling = request.sampling_params
    seed = sampling.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        sampling = {**sampling, "seed": seed + index}
    return ProcessRequest.model_construct(  # fields validated with the group request
        instance=request.instance,
        sampling_params=sampling,
        agent_config=request.agent_config,
        job_id=f"{group_id}:{index}",
        timeout=request.timeout,
        max_staleness=request.max_staleness,
        stale_policy=request.stale_policy,
    )


def response_length(result: JobResult) -> int:
    """Response tokens of a result (model and observation tokens after the prompt)."""
    return len(result.trajectory.response_ids)


def is_truncated(result: JobResult) -> bool:
    """Whether a result hit a length limit: its last turn stopped on `length`, or its handler says so
    (`eval["truncated"] is True`)."""
    turns = result.trajectory.turns
    return (bool(turns) and turns[-1].finish_reason == "length") or result.eval.get("truncated") is True


def select(selection: Selection, n: int, finished: list[tuple[int, JobResult]]) -> list[tuple[int, MemberRole]]:
    """(member index, role) of the selected members, in the order selected, among `finished` (in finish
    order); only completed results are usable.

    `first_n`: the first `n` usable. `dual_end`: the `K = ceil(n/2)` shortest usable (ascending), then the
    `L = n - K` longest (descending) among the rest that are not truncated; slots no such member can take
    go to the next shortest of the rest (role `short`).
    """
    usable = [(index, result) for index, result in finished if result.status == JobStatus.COMPLETED]
    if selection == Selection.FIRST_N:
        return [(index, MemberRole.FIRST) for index, _ in usable[:n]]
    by_length = sorted(usable, key=lambda m: (response_length(m[1]), m[0]))
    k = math.ceil(n / 2)
    short, rest = by_length[:k], by_length[k:]
    long = [m for m in reversed(rest) if not is_truncated(m[1])][: n - k]
    taken = {index for index, _ in long}
    fill = [m for m in rest if m[0] not in taken][: n - len(short) - len(long)]
    return [(index, MemberRole.SHORT) for index, _ in short + fill] + [(index, MemberRole.LONG) for index, _ in long]


class Group:
    """One group's members and, once decided, its selection. Touched only on the API's event loop."""

    def __init__(
        self,
        group_id: str,
        request: GroupRequest,
        digest: str,
        jobs: list[Job | FinishedJob],
        tail_pruned: bool = False,
        fork: GroupFork | None = None,
    ) -> None:
        self.id = group_id
        self.request = request
        self.digest = digest
        self.jobs = jobs
        self.tail_pruned = tail_pruned
        self.fork = fork  # the members' shared INIT (None: each member runs its own)
        self.slots = list(range(len(jobs)))  # per member, the index of the launched member it stands for
        self.refills: list[GroupRefill] = []
        self.cancelled = False
        self.finished: list[tuple[int, JobResult]] = []  # terminal members, in finish order
        self.selected: list[tuple[int, MemberRole]] = []
        self.status = GroupStatus.RUNNING
        self.done = asyncio.Event()
        self.finished_at: float | None = None
        self.task: asyncio.Task[None] | None = None

    @property
    def job_ids(self) -> list[str]:
        return [job.id for job in self.jobs]

    @property
    def usable(self) -> int:
        return sum(result.status == JobStatus.COMPLETED for _, result in self.finished)

    @property
    def selection(self) -> Selection:
        """The policy applied: the requested one, or `first_n` when the group is tail-pruned."""
        return Selection.FIRST_N if self.tail_pruned else self.request.selection

    def needs_member(self, running: int) -> bool:
        """Whether a failed member should be replaced, with `running` members still running: not once
        cancelled; `first_n` (and a tail-pruned group) only while the running ones cannot make `n` usable;
        `dual_end` always, since it selects among all its members."""
        if self.cancelled:
            return False
        if self.selection == Selection.FIRST_N:
            return self.usable + running < self.request.n
        return True

    def refills_of(self, index: int) -> int:
        """Refills launched so far for the slot member `index` stands for."""
        slot = self.slots[index]
        return sum(self.slots[refill.index] == slot for refill in self.refills)

    def sampled_versions(self) -> tuple[str | int, ...]:
        """The weight versions the finished members' turns were sampled under, each once."""
        seen: list[str | int] = []
        for _, result in self.finished:
            seen.extend(v for v in result.trajectory.weight_versions if not _among(v, seen))
        return tuple(seen)

    def usable_lengths(self) -> list[int]:
        """Response lengths of the members that completed."""
        return [response_length(result) for _, result in self.finished if result.status == JobStatus.COMPLETED]

    def decide(self) -> None:
        """Apply the selection to the finished members and set the final status."""
        self.selected = select(self.selection, self.request.n, self.finished)
        self.status = GroupStatus.COMPLETED if self.usable >= self.request.needed else GroupStatus.FAILED

    def snapshot(self) -> GroupResult:
        """The group as the API shows it now."""
        results = dict(self.finished)
        roles = dict(self.selected)
        replaced = {refill.index: refill.replaced_job_id for refill in self.refills}
        members = []
        for index, job in enumerate(self.jobs):
            result = results.get(index)
            if result is None:
                members.append(
                    GroupMember(index=index, job_id=job.id, status=_live_status(job), refill_of=replaced.get(index))
                )
                continue
            members.append(
                GroupMember(
                    index=index,
                    job_id=job.id,
                    status=result.status,
                    reward=result.reward,
                    response_length=response_length(result),
                    truncated=is_truncated(result),
                    selected=index in roles,
                    role=roles.get(index),
                    refill_of=replaced.get(index),
                    weight_versions=result.trajectory.weight_versions,
                )
            )
        request = self.request
        return GroupResult(
            group_id=self.id,
            status=self.status,
            selection=request.selection,
            n=request.n,
            n_launch=len(self.jobs) - len(self.refills),
            tail_pruned=self.tail_pruned,
            min_usable=request.needed,
            usable=self.usable,
            partial=self.status != GroupStatus.RUNNING and len(self.selected) < request.n,
            members=members,
            refills=list(self.refills),
            results=[results[index] for index, _ in self.selected],
        )


def _live_status(job: Job | FinishedJob) -> JobStatus:
    return job.status if isinstance(job, Job) else job.result.status


def _among(version: str | int, versions: list[str | int]) -> bool:
    return any(type(v) is type(version) and v == version for v in versions)  # 1 and "1" are two versions


class GroupRunner:
    """Starts groups, runs their selection, and keeps them (finished ones within retention and a cap)."""

    def __init__(
        self,
        orchestrator: Orchestrator,
        retention_s: float | None = None,
        max_finished: int = MAX_FINISHED_GROUPS,
        clock: Callable[[], float] = time.monotonic,
        *,
        on_refill: Callable[[str], None] | None = None,
    ) -> None:
        self.orchestrator = orchestrator
        self.retention_s = retention_s if retention_s is not None else orchestrator.settings.result_retention_s
        self.max_finished = max_finished
        self._clock = clock
        self._running: dict[str, Group] = {}
        self._finished: OrderedDict[str, Group] = OrderedDict()  # in finish order
        self.lengths = LengthHistory()
        self.refill_attempts = orchestrator.settings.group_refill_attempts
        self.max_refills = orchestrator.settings.group_max_refills
        self.on_refill = on_refill  # each refill launched, with its reason (metrics)

    def start(self, request: GroupRequest) -> Group:
        """Submit the members and start the group (call on the event loop). The same request under the same
        `group_id` gets that group back; a different one raises DuplicateGroup. An instance its handler's
        `validate_instance` refuses raises InvalidInstance before any member is submitted. A member the
        orchestrator refuses (a SubmissionError) cancels the members already submitted and is raised."""
        group_id = request.group_id or uuid.uuid4().hex
        digest = group_digest(request)
        existing = self.get(group_id)
        if existing is not None:
            if existing.digest != digest:
                raise DuplicateGroup(
                    f"group_id {group_id!r} is already used by a different group request; the same request sent "
                    "again gets that group, a new request needs another id"
                )
            return existing
        check_instance(self.orchestrator.registry, request.instance)  # once for all members
        launch, tail_pruned = self._size(request)
        fork = self._fork(group_id, request)
        jobs: list[Job | FinishedJob] = []
        try:
            for index in range(launch):
                jobs.append(
                    self.orchestrator.admit(member_request(request, group_id, index), fork=fork, validate=False)
                )
        except SubmissionError:
            for job in jobs:
                self.orchestrator.cancel(job.id, f"group {group_id!r} could not be started")
            raise
        group = Group(group_id, request, digest, jobs, tail_pruned, fork)
        self._running[group_id] = group
        group.task = asyncio.get_running_loop().create_task(self._run(group), name=f"prorl-group-{group_id}")
        return group

    def _fork(self, group_id: str, request: GroupRequest) -> GroupFork | None:
        """The members' shared INIT when the handler asks for it (`fork_after_init`) and the runtime forks;
        else None (each member runs its own INIT, as it does when the runtime cannot fork: logged)."""
        manager = self.orchestrator.sandboxes
        data_source = request.instance.get("data_source")
        if manager is None or not isinstance(data_source, str):
            return None  # a missing data_source is refused by `Orchestrator.submit`
        try:
            handler = self.orchestrator.registry.get(data_source)
        except (UnknownDataSource, HandlerLoadError):  # refused by `Orchestrator.submit`
            return None
        if not handler.fork_after_init:
            return None
        reason = manager.runtime.fork_unavailable()
        if reason is not None:
            log.info("group %s: each member runs its own INIT (%s)", group_id, reason)
            return None
        return GroupFork(group_id, manager)

    def _size(self, request: GroupRequest) -> tuple[int, bool]:
        """Members to launch, and whether the group is tail-pruned (adaptive dual_end at its max_launch)."""
        adaptive = request.adaptive
        if adaptive is None:
            return request.launch, False
        launch = self.lengths.budget(prompt_key(request), request.n, adaptive.redundancy, request.max_launch)
        return launch, request.selection == Selection.DUAL_END and launch >= request.max_launch

    def get(self, group_id: str) -> Group | None:
        """A running group, or a finished one still kept."""
        self._purge()
        return self._running.get(group_id) or self._finished.get(group_id)

    def cancel(self, group_id: str) -> Group | None:
        """Cancel the group's members still running, refills included, and launch no more refills (the group
        then ends with what it has); None if unknown."""
        group = self.get(group_id)
        if group is not None and not group.done.is_set():
            group.cancelled = True
            self._cancel_members(group, {job.id for job in group.jobs}, "the group was cancelled by the client")
        return group

    def __len__(self) -> int:
        self._purge()
        return len(self._running) + len(self._finished)

    async def _run(self, group: Group) -> None:
        waits = {asyncio.ensure_future(job.wait()): index for index, job in enumerate(group.jobs)}
        pending = set(waits)
        stopping = False
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for future in sorted(done, key=waits.__getitem__):
                    group.finished.append((waits[future], future.result()))
                for index, result in group.finished[-len(done) :]:  # refills see every member that just ended
                    refill = None if stopping else self._refill(group, index, result, len(pending))
                    if refill is not None:
                        future = asyncio.ensure_future(refill.wait())
                        waits[future] = len(group.jobs) - 1
                        pending.add(future)
                if (
                    not stopping
                    and pending
                    and group.selection == Selection.FIRST_N
                    and group.usable >= group.request.n
                ):
                    stopping = True
                    live = {group.jobs[waits[future]].id for future in pending}
                    reason = f"group {group.id!r} already has its {group.request.n} usable results"
                    self._cancel_members(group, live, reason)
            group.decide()
            self.lengths.record(prompt_key(group.request), group.usable_lengths())
        except BaseException as exc:  # the loop is closing (CancelledError), or a bug: end with nothing selected
            for future in pending:
                future.cancel()
            live = {group.jobs[waits[future]].id for future in pending}
            self._cancel_members(group, live, f"group {group.id!r} ended without a selection")
            group.selected = []
            group.status = GroupStatus.FAILED
            if not isinstance(exc, Exception):
                raise
            log.exception("group %s failed", group.id)
        finally:
            if group.fork is not None:  # every member has ended: the snapshots go
                await group.fork.aclose()
            group.finished_at = self._clock()
            self._running.pop(group.id, None)
            self._finished[group.id] = group
            group.done.set()
            self._purge()

    def _refill(self, group: Group, index: int, result: JobResult, running: int) -> Job | FinishedJob | None:
        """Launch a member in place of member `index` when it failed for an infrastructure reason and the
        group needs one (`running` members still run), within the refill limits: the new member, or None."""
        reason = refill_reason(result)
        if (
            reason is None
            or not group.needs_member(running)
            or group.refills_of(index) >= self.refill_attempts
            or len(group.refills) >= self.max_refills
        ):
            return None
        new_index = len(group.jobs)
        replaced = group.jobs[index].id
        try:
            request = member_request(group.request, group.id, new_index)
            job = self.orchestrator.admit(request, group.sampled_versions(), fork=group.fork, validate=False)
        except SubmissionError as exc:
            log.warning("group %s: member %s failed (%s) and cannot be refilled: %s", group.id, replaced, reason, exc)
            return None
        group.jobs.append(job)
        group.slots.append(group.slots[index])
        group.refills.append(GroupRefill(index=new_index, job_id=job.id, replaced_job_id=replaced, reason=reason))
        log.info("group %s: member %s failed (%s); refilled by %s", group.id, replaced, reason, job.id)
        if self.on_refill is not None:
            self.on_refill(reason)
        return job

    def _cancel_members(self, group: Group, job_ids: set[str], reason: str) -> None:
        for job in group.jobs:
            if job.id in job_ids:
                self.orchestrator.cancel(job.id, reason)

    def _purge(self) -> None:
        horizon = self._clock() - self.retention_s
        while self._finished:
            group_id, group = next(iter(self._finished.items()))
            if len(self._finished) <= self.max_finished and (group.finished_at or 0.0) > horizon:
                break
            del self._finished[group_id]


async def wait_done(group: Group, timeout: float | None) -> None:
    """Wait until the group is decided, or `timeout` seconds (None: no limit)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(group.done.wait(), timeout)
