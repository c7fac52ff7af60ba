"""ProrlError: the root of every exception prorl-server (and its bundled handlers) raises.

`except ProrlError` catches the server's own errors and nothing else: not a handler's bugs, not the
builtins. Each area has its tree; a class that code or users may catch by a builtin keeps that builtin as a
second base (shown in brackets), so `except RuntimeError` still catches a SandboxError. Roots marked * are
defined here, the others in the module named beside them. tests/layout/test_error_tree.py checks that every
exception class of src/prorl_server and handlers/src derives from ProrlError and is named in this tree.

ProrlError
├── SandboxError [RuntimeError] ........................ sandbox/errors.py: could not start or use a sandbox
│   └── LoopbackExhausted .............................. sandbox/loopback.py: no free address for one
├── ImageError * ....................................... imaging/: building images
│   ├── ImageBuildError [RuntimeError] ................. imaging/images.py
│   │   └── DockerfileError ............................ imaging/dockerfile.py
│   └── ImageSpecError [ValueError] .................... imaging/instance_images.py
├── ToolError .......................................... tool_server/errors.py: the tool client's
│   └── _Typed
│       ├── SandboxFailure
│       │   ├── SandboxGone
│       │   │   └── ClientClosed
│       │   ├── ToolTimeout
│       │   └── ProtocolError
│       └── ActionError
│           ├── BadRequest
│           ├── EditRefused
│           ├── FileTooLarge
│           ├── IPythonUnavailable
│           ├── FileSystemError
│           │   ├── FileMissing
│           │   ├── IsADirectory
│           │   └── PermissionDenied
│           └── ServerError
├── ExecutionServerError * ............................. tool_server/: raised inside the sandbox's server
│   ├── BadRequest ..................................... tool_server/server.py
│   ├── ShellGone ...................................... tool_server/bash.py
│   ├── EditError ...................................... tool_server/editor.py
│   ├── FileTooLarge ................................... tool_server/files.py
│   ├── IPythonUnavailable ............................. tool_server/ipython_kernel.py
│   └── KernelDied ..................................... tool_server/ipython_kernel.py
├── LLMError ........................................... llm/errors.py: LLM backends and sessions
│   ├── BackendUnavailable
│   │   ├── BackendProtocolError
│   │   └── BackendStalled
│   ├── BackendRequestError
│   ├── NoBackendAvailable
│   ├── ChatTemplateError
│   ├── SessionFinished
│   ├── StaleRollout ................................... llm/session.py
│   ├── FreezeRefused .................................. llm/engine_freeze.py
│   ├── ReloadFailed ................................... llm/vllm_admin.py
│   ├── WeightUpdateConflict ........................... llm/weight_update.py
│   ├── WeightReloadFailed ............................. llm/weight_update.py
│   ├── WeightRestoreFailed ............................ llm/weight_update.py
│   └── JudgeError ..................................... llm/judge.py
│       └── JudgeUnavailable
├── JudgeConfigError [ValueError] ...................... llm/judge.py
├── TokenizerUnavailable ............................... llm/local_tokenizer.py
├── DispatchAborted .................................... llm/weight_pause_gate.py
├── GatewayError ....................................... gateway/errors.py: an OpenAI-shaped HTTP answer
│   └── ContextLengthExceeded
├── _Refused ........................................... gateway/bridge.py
├── ResourceError * .................................... actions/: per-action resources
│   ├── ActionRefused [ValueError] ..................... actions/scheduler.py
│   ├── ServiceDisabled [RuntimeError] ................. actions/quota.py
│   ├── ModelProcessError [RuntimeError] ............... actions/model_processes.py
│   ├── ModelServiceRefused [ValueError] ............... actions/model_services.py
│   └── ModelServiceUnavailable [RuntimeError] ......... actions/model_services.py
├── HandlerApiError * .................................. handlers/: the handler API
│   ├── UnknownDataSource [LookupError] ................ handlers/registry.py
│   ├── HandlerLoadError [RuntimeError] ................ handlers/registry.py
│   └── JobFinished [RuntimeError] ..................... handlers/context.py
├── ToolArgumentError [ValueError] ..................... agent/tool_specs.py
├── PipelineError * .................................... pipeline/
│   ├── SubmissionError ................................ pipeline/errors.py
│   │   ├── InvalidInstance
│   │   ├── DuplicateJob
│   │   │   └── DuplicateGroup ......................... pipeline/groups.py
│   │   └── NotAccepting
│   ├── HandlerFault ................................... pipeline/handler_calls.py
│   └── ForkStateError [TypeError] ..................... pipeline/fork.py
├── JournalError [RuntimeError] ........................ journal/database.py: the results journal
│   └── WriterGone ..................................... journal/process.py: its writer process ended
├── BodyTooLarge [HTTPException] ....................... api/body_limit.py
├── ApiKeyFileError [RuntimeError] ..................... auth_key.py: configuration
├── DevLLMError * ...................................... devllm/
│   ├── DevLLMRequestError ............................. devllm/errors.py
│   └── MissingDependency [ImportError] ................ devllm/errors.py
├── TestDoubleError * .................................. testing/
│   ├── NoReplyQueued [LookupError] .................... testing/scripted_backend.py
│   └── ContextRefused [ValueError] .................... testing/scripted_backend.py
├── TrainerError * ..................................... client/, training/: the trainer's side
│   ├── RolloutServerError [RuntimeError] .............. client/errors.py
│   │   └── ClusterUpdateFailed
│   ├── _Failure ....................................... client/weight_sync.py
│   ├── WeightSyncError [RuntimeError] ................. training/weights.py
│   └── VerlRolloutError ............................... training/verl_errors.py: the verl agent loop
│       ├── UnknownTaskSource [LookupError]
│       └── RolloutFailed [RuntimeError]
├── LaunchError * ...................................... entry points
│   ├── DeploymentError [RuntimeError] ................. launch/slurm.py
│   ├── EvalError ...................................... evaluation/errors.py
│   ├── ProfilingError [RuntimeError] .................. backend_profiler.py
│   ├── VllmNotInstalled [RuntimeError] ................ vllm_cpu/install.py
│   └── VllmStartError [RuntimeError] .................. vllm_cpu/launcher.py
└── BundledHandlerError ................................ prorl_handlers/errors.py: the bundled handlers
    ├── EnvAdapterError ................................ prorl_handlers/env_adapters.py: skyrl-gym, verifiers
    │   ├── UnknownEnvironment [LookupError]
    │   ├── EnvironmentFailed
    │   └── MalformedObservation [ValueError]
    ├── HarnessInstallError [RuntimeError] ............. prorl_handlers/harnesses/install.py
    ├── HarnessNotInstalled [LookupError] .............. prorl_handlers/harnesses/install.py
    ├── RepositoryError [RuntimeError] ................. prorl_handlers/swe/repo.py
    └── TaskError [ValueError] ......................... prorl_handlers/harbor/task.py

How a failure reaches the wire is read off the class, here and nowhere else:

- `error_kind` is the `ErrorInfo.type` of a job that failed on the exception: the class's own name unless
  the class names its `ErrorKind` (SandboxError, BackendUnavailable, ...). It is not inherited: a subclass
  is its own kind. `error_kind_of(exc)` gives it for any exception (a handler's: its class name).
- `http_status` is the status the HTTP API answers with when the exception ends a request: None (the
  default) for none, so it is a 500, a prorl-server bug. It is inherited (DuplicateGroup is a 409 as
  DuplicateJob is). A GatewayError carries its own, per instance.

Standard library only and imports nothing: the in-sandbox execution server (tool_server/) imports it at startup.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: the execution server imports nothing it does not need
if TYPE_CHECKING:
    from typing import Any, ClassVar


class ProrlError(Exception):
    """An error of prorl-server's own (see the module docstring for the tree)."""

    error_kind: ClassVar[str] = "ProrlError"
    """`ErrorInfo.type` of a job that failed on this error (set on every subclass: its name by default)."""
    http_status: int | None = None
    """The HTTP API's status for this error; None: not a request's fault (a 500)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "error_kind" not in cls.__dict__:
            cls.error_kind = cls.__name__


def error_kind_of(exc: BaseException) -> str:
    """`ErrorInfo.type` of a job that failed on `exc`: a ProrlError's `error_kind`, else its class name."""
    return exc.error_kind if isinstance(exc, ProrlError) else type(exc).__name__


class ImageError(ProrlError):
    """A sandbox image could not be built, or its spec is wrong."""


class ExecutionServerError(ProrlError):
    """Raised inside a sandbox by the execution server's tools; the client sees it as a ToolError."""


class ResourceError(ProrlError):
    """An action's resources (cores, memory, model services) were refused or could not be provided."""


class HandlerApiError(ProrlError):
    """The handler API: a handler that cannot be found or loaded, or a job that has finished."""


class PipelineError(ProrlError):
    """The job pipeline: a refused submission, a handler's fault, a fork that cannot go on."""


class DevLLMError(ProrlError):
    """The dev engine (devllm/)."""


class TestDoubleError(ProrlError):
    """The test doubles (testing/): a scripted backend asked what its script does not hold."""

    __test__ = False  # not a test class for pytest


class TrainerError(ProrlError):
    """The trainer's side: the rollout client and the weight sync."""


class LaunchError(ProrlError):
    """The entry points: a deployment, a vLLM install or start, a backend profile that failed."""
