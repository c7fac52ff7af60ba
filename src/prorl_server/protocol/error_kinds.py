"""ErrorKind: the server's own values of `ErrorInfo.type`.

A str enum, so each kind goes on the wire as its value, exactly the string it replaced. `ErrorInfo.type` is
`ErrorKind | str`: a job that failed on an exception of the handler's has that exception's class name instead
(`handlers.default_error`), whatever it is.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    """Why a job ended without a result of its handler's, as `ErrorInfo.type`."""

    # decided by the server (pipeline/stage_runner.py, pipeline/outcome.py, journal/journal.py)
    TIMEOUT = "Timeout"  # the job's budget ran out in a stage, or final_result() did not return in time
    CANCELLED = "Cancelled"  # POST /cancel, or the job's group was cancelled or no longer needed it
    SERVER_STOPPED = "ServerStopped"  # POST /stop or SIGTERM while the job was live
    SERVER_RESTARTED = "ServerRestarted"  # in flight when the server died, failed when it restarted
    STALE_ROLLOUT = "StaleRollout"  # bounded staleness ended it (llm.session.StaleRollout)
    CANCELLED_ERROR = "CancelledError"  # the handler cancelled its own stage task
    STAGE_LOOP_DIED = "StageLoopDied"  # the stage's event loop died while the job was in it
    INTERNAL_ERROR = "InternalError"  # a bug in prorl-server
    INVALID_RESULT = "InvalidResult"  # artifacts or eval details are not JSON values
    BAD_FINAL_RESULT = "TypeError"  # final_result() returned no JobResult of the job
    # infrastructure failures: exceptions of the server's, named by their class (a group refills these)
    SANDBOX_ERROR = "SandboxError"  # sandbox.base.SandboxError: the sandbox could not be started or used
    BACKEND_UNAVAILABLE = "BackendUnavailable"  # llm.errors: every request failed, past failovers and retries
    BACKEND_STALLED = "BackendStalled"  # the same, the last request having stalled
    BACKEND_PROTOCOL_ERROR = "BackendProtocolError"  # the same, the last answer having broken vLLM's protocol
    NO_BACKEND_AVAILABLE = "NoBackendAvailable"  # no backend could take the call within the retry budget
