"""Group schemas: `n_launch` redundant rollouts of one instance, of which `n` are selected.

A group launches `n_launch >= n` jobs of the same instance (member job ids `f"{group_id}:{i}"`) and keeps
`n` usable (completed) results, chosen by a selection policy:

- `first_n` (default; ROLLART's redundant rollouts): the first `n` usable members to finish; the rest are
  cancelled as soon as `n` are usable.
- `dual_end` (DARTS' dual-end length sampling): every member runs to its end; then the `K = ceil(n/2)`
  shortest usable members (by response length) and the `L = n - K` longest are kept. A truncated member
  (its last turn stopped on `finish_reason: "length"`, or its handler set `eval["truncated"] = true`) is
  never chosen as one of the longest.

With `adaptive` (DARTS' variance-based adaptive redundancy), the server chooses `n_launch` itself, between
`n` and `max_launch`, from the spread of response lengths this prompt showed in its earlier groups: prompts
whose lengths varied more get more members. A `dual_end` group whose budget reaches `max_launch` is
tail-pruned (DARTS' shortest-only sampling with proactive early stop): it keeps the first `n` usable members
to finish and cancels the rest, as `first_n` does. See pipeline/redundancy.py.

A member that fails for an infrastructure reason (pipeline/refill.py) is refilled: launched again as a new
member while the group still needs it, within the server's refill limits; `refills` lists each refill.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from prorl_server.protocol.bounded import JOB_ID_MAX_CHARS, TaskJson
from prorl_server.protocol.jobs import JobResult, JobStatus, StalePolicy

MAX_GROUP_SIZE = 1024
"""Most members (`n_launch`) one group may launch."""

GROUP_ID_MAX_CHARS = JOB_ID_MAX_CHARS - 1 - len(str(MAX_GROUP_SIZE - 1))
"""Room left for `:{i}` in the member job ids."""

GroupId = Annotated[str, Field(min_length=1, max_length=GROUP_ID_MAX_CHARS, pattern=r"^[^/:]+$")]
"""A group id: 1 to 252 characters, no `/` (it is a path segment) and no `:` (member job ids are
`{group_id}:{i}`, usable in `/jobs/{job_id}`)."""


class Selection(StrEnum):
    """How a group picks its `n` results among the usable members."""

    FIRST_N = "first_n"
    DUAL_END = "dual_end"


class GroupStatus(StrEnum):
    """`running` until the group is decided; then `completed` (at least `min_usable` usable results) or
    `failed` (fewer)."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


class MemberRole(StrEnum):
    """Why a member was selected: among the first n to finish, or the shortest / longest (dual_end)."""

    FIRST = "first"
    SHORT = "short"
    LONG = "long"


class AdaptiveBudget(BaseModel):
    """`POST /groups` `adaptive`: let the server choose `n_launch` per prompt (DARTS' adaptive redundancy)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_launch: int | None = Field(
        default=None, ge=1, le=MAX_GROUP_SIZE, description="Most members to launch (DARTS' M_up; default 2n)."
    )
    redundancy: float = Field(
        default=1.5,
        ge=1.0,
        le=float(MAX_GROUP_SIZE),
        description="Members per selected result on average over prompts (n_launch / n before clipping to "
        "[n, max_launch]); a prompt not seen before gets this ratio.",
    )
    prompt_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="The prompt's identity in the server's length history (default: a digest of `instance`).",
    )


class GroupRequest(BaseModel):
    """Body of `POST /groups`. `instance`, `sampling_params`, `agent_config`, `timeout`, `max_staleness` and
    `stale_policy` are those of `POST /process` and go to every member; an integer `sampling_params.seed` becomes `seed + i` for member
    `i`, so that seeded members do not sample the same response."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    instance: TaskJson = Field(description="The task instance; must contain `data_source`.")
    sampling_params: TaskJson = Field(default_factory=dict)
    agent_config: TaskJson = Field(default_factory=dict)
    timeout: float | None = Field(
        default=None, gt=0, le=30 * 24 * 3600, description="Seconds of stage time per member (queues excluded)."
    )
    n: int = Field(ge=1, le=MAX_GROUP_SIZE, description="Results to select.")
    n_launch: int | None = Field(
        default=None, ge=1, le=MAX_GROUP_SIZE, description="Members to launch (>= n; default n)."
    )
    min_usable: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GROUP_SIZE,
        description="Usable results the group needs to be `completed` rather than `failed` (<= n; default n).",
    )
    max_staleness: int | None = Field(
        default=None,
        ge=0,
        lt=2**63,
        strict=True,
        description="Every member's max_staleness (as on POST /process; default: the server's).",
    )
    stale_policy: StalePolicy | None = Field(
        default=None, description="Every member's stale_policy (as on POST /process; default: the server's)."
    )
    selection: Selection = Selection.FIRST_N
    adaptive: AdaptiveBudget | None = Field(
        default=None, description="Let the server choose n_launch from this prompt's length history (DARTS)."
    )
    group_id: GroupId | None = Field(default=None, description="Generated when absent.")

    @model_validator(mode="after")
    def _check_sizes(self) -> GroupRequest:
        if self.n_launch is not None and self.n_launch < self.n:
            raise ValueError(f"n_launch ({self.n_launch}) must be at least n ({self.n})")
        if self.adaptive is not None:
            if self.n_launch is not None:
                raise ValueError("give n_launch or adaptive, not both: with adaptive the server chooses n_launch")
            if self.max_launch < self.n:
                raise ValueError(f"adaptive.max_launch ({self.max_launch}) must be at least n ({self.n})")
        if self.min_usable is not None and self.min_usable > self.n:
            raise ValueError(f"min_usable ({self.min_usable}) must be at most n ({self.n})")
        return self

    @property
    def launch(self) -> int:
        """Members to launch when the count is fixed (`n_launch`, default `n`)."""
        return self.n_launch if self.n_launch is not None else self.n

    @property
    def expected_launch(self) -> int:
        """Members this group is likely to launch: `launch`, or with `adaptive` its average, `n * redundancy`."""
        if self.adaptive is None:
            return self.launch
        return max(self.n, min(self.max_launch, round(self.n * self.adaptive.redundancy)))

    @property
    def max_launch(self) -> int:
        """Most members an adaptive group may launch (`adaptive.max_launch`, default `2n` within the cap)."""
        chosen = self.adaptive.max_launch if self.adaptive is not None else None
        return chosen if chosen is not None else min(2 * self.n, MAX_GROUP_SIZE)

    @property
    def needed(self) -> int:
        """Usable results for the group to complete."""
        return self.min_usable if self.min_usable is not None else self.n


class GroupMember(BaseModel):
    """One launched member: its state now, and whether (and why) it was selected."""

    index: int
    job_id: str
    status: JobStatus
    reward: float | None = None
    response_length: int | None = Field(
        default=None, description="Response tokens (`len(trajectory.response_ids)`); null until terminal."
    )
    truncated: bool = Field(default=False, description="It hit a length limit (never selected as longest).")
    selected: bool = False
    role: MemberRole | None = Field(default=None, description="Why it was selected (null if not).")
    refill_of: str | None = Field(
        default=None, description="The job id of the failed member this one was launched to replace (null if none)."
    )
    weight_versions: list[str | int] = Field(
        default_factory=list, description="Weight versions its turns were sampled under, in order (once terminal)."
    )


class GroupRefill(BaseModel):
    """One refill: member `index` was launched to replace `replaced_job_id`, which failed with `reason`."""

    index: int
    job_id: str
    replaced_job_id: str
    reason: str = Field(description="The replaced member's `error.type` (an infrastructure failure).")


class GroupResult(BaseModel):
    """Answer of `POST /groups` and `GET /groups/{group_id}`.

    `members` lists every launched member by index (cancelled, unselected and refilled ones included);
    `results` holds the selected members' full results in the order selected (empty while running).
    `partial` is true when fewer than `n` results were selected. `refills` lists the members launched to
    replace members that failed for an infrastructure reason, in launch order.
    """

    group_id: str
    status: GroupStatus
    selection: Selection
    n: int
    n_launch: int = Field(
        description="Members launched at the start (chosen by the server with `adaptive`); refills come on top."
    )
    tail_pruned: bool = Field(
        default=False,
        description="An adaptive dual_end group at its max_launch: the first n usable were kept, the rest cancelled.",
    )
    min_usable: int
    usable: int = Field(description="Members that completed.")
    partial: bool = False
    members: list[GroupMember]
    refills: list[GroupRefill] = Field(default_factory=list)
    results: list[JobResult] = Field(default_factory=list)


class GroupAccepted(BaseModel):
    """Answer of `POST /groups?wait=false`: the group id and its member job ids."""

    group_id: str
    job_ids: list[str]
