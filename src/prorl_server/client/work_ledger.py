"""The work a client submitted and has not handed out yet, with the server holding each piece: what the
client submits again, under the same ids, when that server is lost."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class PendingJob:
    """A job submitted on its own (`POST /jobs` or `/process`): its id, its JSON body (with that id; bytes,
    which the garbage collector does not track) and its server."""

    job_id: str
    body: bytes
    owner: str
    avoid: str | None = None
    """A server not to move it to (a replacement that failed it at its restart)."""


@dataclass
class PendingGroup:
    """A group (`POST /groups`): its body (with its group id), its server and its members' job ids."""

    body: dict[str, Any]
    owner: str
    member_ids: list[str]

    @property
    def group_id(self) -> str:
        """The group's id."""
        return str(self.body["group_id"])


class WorkLedger:
    """Unfinished work by id, and, per server, the ids moved off it (to cancel there if it comes back).

    A job or group leaves the ledger once its result is handed out (or acknowledged, or cancelled); a group's
    members move with their group, never on their own."""

    def __init__(self) -> None:
        self.jobs: dict[str, PendingJob] = {}
        self.groups: dict[str, PendingGroup] = {}
        self.moved_jobs: dict[str, set[str]] = defaultdict(set)
        self.moved_groups: dict[str, set[str]] = defaultdict(set)

    def job_submitted(self, job_id: str, body: bytes, owner: str) -> None:
        """A job (its JSON body) went to `owner`."""
        self.jobs[job_id] = PendingJob(job_id, body, owner)

    def group_submitted(self, body: dict[str, Any], owner: str, member_ids: list[str]) -> None:
        """A group went to `owner`, which launched `member_ids`."""
        self.groups[str(body["group_id"])] = PendingGroup(body, owner, list(member_ids))

    def job_taken(self, job_id: str) -> None:
        """The job's result was handed out (or the job was given up)."""
        self.jobs.pop(job_id, None)

    def group_taken(self, group_id: str) -> None:
        """The group's answer was handed out (or the group was given up)."""
        self.groups.pop(group_id, None)

    def owner(self, job_id: str) -> str | None:
        """The server that has the job now, if the ledger holds it."""
        job = self.jobs.get(job_id)
        return job.owner if job is not None else None

    def work_on(self, server: str) -> tuple[list[PendingJob], list[PendingGroup]]:
        """The unfinished jobs and groups `server` holds."""
        jobs = [job for job in self.jobs.values() if job.owner == server]
        groups = [group for group in self.groups.values() if group.owner == server]
        return jobs, groups

    def job_moved(self, job_id: str, old: str, new: str) -> None:
        """The job was submitted again on `new`; the copy on `old` is to be cancelled."""
        self.jobs[job_id].owner = new
        self.moved_jobs[old].add(job_id)
        self.moved_jobs[new].discard(job_id)

    def group_moved(self, group_id: str, old: str, new: str) -> None:
        """The group was submitted again on `new`; the copy on `old` is to be cancelled."""
        self.groups[group_id].owner = new
        self.moved_groups[old].add(group_id)
        self.moved_groups[new].discard(group_id)

    def take_moved(self, server: str) -> tuple[set[str], set[str]]:
        """The job and group ids moved off `server` (forgotten: the caller cancels them there)."""
        return self.moved_jobs.pop(server, set()), self.moved_groups.pop(server, set())
