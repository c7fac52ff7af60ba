"""Why the pipeline refuses a submission; each carries the HTTP status the API answers with."""

from __future__ import annotations

from prorl_server.errors import PipelineError


class SubmissionError(PipelineError):
    """Base class: the job was not accepted."""


class InvalidInstance(SubmissionError):
    """The instance cannot be routed (for example no `data_source`), or its handler's `validate_instance`
    refused it."""

    http_status = 400


class DuplicateJob(SubmissionError):
    """A live job already has this job_id."""

    http_status = 409


class NotAccepting(SubmissionError):
    """The server is stopped, or no LLM backend can serve jobs."""

    http_status = 503
