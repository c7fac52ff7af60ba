"""Moved to `pipeline.admission` (validation, idempotence and job creation, in one `admit()`); these names
stay importable from here."""

from prorl_server.pipeline.admission import (
    MAX_FIELD_ERRORS,
    AdmissionLog,
    FinishedJob,
    check_instance,
    request_digest,
)

__all__ = ["MAX_FIELD_ERRORS", "AdmissionLog", "FinishedJob", "check_instance", "request_digest"]
