"""Why the pipeline refuses a submission; the API maps each to an HTTP status."""

from __future__ import annotations


class SubmissionError(Exception):
    """Base class: the job was not accepted."""


class InvalidInstance(SubmissionError):
    """The instance cannot be routed (for example no `data_source`), or its handler's `validate_instance`
    refused it. HTTP 400."""


class DuplicateJob(SubmissionError):
    """A live job already has this job_id. HTTP 409."""


class NotAccepting(SubmissionError):
    """The server is stopped, or no LLM backend can serve jobs. HTTP 503."""
