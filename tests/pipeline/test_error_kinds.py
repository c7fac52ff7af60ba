"""Stage, ErrorStage and ErrorKind (protocol/): str enums whose values are exactly the strings they replaced."""

from __future__ import annotations

from prorl_server.journal import RESTART_ERROR_TYPE
from prorl_server.llm.errors import BackendProtocolError, BackendStalled, BackendUnavailable, NoBackendAvailable
from prorl_server.llm.session import StaleRollout
from prorl_server.pipeline.refill import INFRASTRUCTURE_ERRORS
from prorl_server.protocol import ErrorInfo, ErrorKind, ErrorStage, Stage
from prorl_server.sandbox.errors import SandboxError


def test_the_kinds_that_are_exceptions_are_named_as_their_classes():
    for kind, exc in [
        (ErrorKind.SANDBOX_ERROR, SandboxError),
        (ErrorKind.BACKEND_UNAVAILABLE, BackendUnavailable),
        (ErrorKind.BACKEND_STALLED, BackendStalled),
        (ErrorKind.BACKEND_PROTOCOL_ERROR, BackendProtocolError),
        (ErrorKind.NO_BACKEND_AVAILABLE, NoBackendAvailable),
        (ErrorKind.STALE_ROLLOUT, StaleRollout),
    ]:
        assert kind == exc.__name__
    assert RESTART_ERROR_TYPE is ErrorKind.SERVER_RESTARTED and RESTART_ERROR_TYPE in INFRASTRUCTURE_ERRORS
    assert "SandboxError" in INFRASTRUCTURE_ERRORS and "ValueError" not in INFRASTRUCTURE_ERRORS


def test_an_error_info_is_the_same_on_the_wire_with_enums_or_strings():
    typed = ErrorInfo(stage=Stage.RUN, type=ErrorKind.TIMEOUT, message="m")
    plain = ErrorInfo(stage="run", type="Timeout", message="m")
    assert (
        typed.model_dump_json()
        == plain.model_dump_json()
        == ('{"stage":"run","type":"Timeout","message":"m","location":null,"traceback":null}')
    )
    assert typed == plain and typed.model_dump() == plain.model_dump()
    restart = ErrorInfo(stage=ErrorStage.RESTART, type=ErrorKind.SERVER_RESTARTED, message="m")
    assert restart.model_dump(mode="json")["stage"] == "restart"


def test_any_stage_or_exception_name_a_handler_gives_is_kept():
    error = ErrorInfo.model_validate_json('{"stage": "setup", "type": "MyHandlerError", "message": "m"}')
    assert error.stage == "setup" and error.type == "MyHandlerError"
    known = ErrorInfo.model_validate_json('{"stage": "eval", "type": "Cancelled", "message": "m"}')
    assert known.stage == Stage.EVAL and known.type == ErrorKind.CANCELLED
