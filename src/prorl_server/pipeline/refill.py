"""Which failed group members are launched again (refilled): those that failed for an infrastructure reason.

A member's failure is classified by the structured `error.type` of its result, never by its message. Only a
`failed` member whose error type is in INFRASTRUCTURE_ERRORS is refilled: its sandbox could not be started or
used, its LLM backends failed past the failovers and the retry budget, or the server restarted while it was
in flight (the results journal). Everything else is signal about the rollout and is kept as it is: an
exception of the handler's own, an EVAL that failed, a job that timed out (its budget covers the handler's
work), went stale or was cancelled.
"""

from __future__ import annotations

from prorl_server.llm import BackendProtocolError, BackendStalled, BackendUnavailable, NoBackendAvailable
from prorl_server.protocol import ErrorKind, JobResult, JobStatus
from prorl_server.sandbox import SandboxError

INFRASTRUCTURE_ERRORS: frozenset[str] = frozenset(
    {
        SandboxError.error_kind,  # the sandbox runtime could not start (or keep) the member's sandbox
        BackendUnavailable.error_kind,  # every LLM request of a call failed, past the failovers and the retry budget
        BackendStalled.error_kind,  # the same, the last request having stalled
        BackendProtocolError.error_kind,  # the same, the last answer having broken vLLM's protocol
        NoBackendAvailable.error_kind,  # no backend could take the call within the retry budget
        ErrorKind.SERVER_RESTARTED,  # the server restarted on its journal while the member was in flight (journal.py)
    }
)
"""`error.type` of the failures a group refills: the `error_kind` of the infrastructure's exceptions."""


def refill_reason(result: JobResult) -> str | None:
    """The infrastructure error type `result` failed with (the reason to refill it), or None when its
    outcome is signal (completed, or failed, timed out, stale or cancelled for any other reason)."""
    if result.status is not JobStatus.FAILED or result.error is None:
        return None
    return result.error.type if result.error.type in INFRASTRUCTURE_ERRORS else None
