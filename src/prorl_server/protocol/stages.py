"""Stage: the three stages a job goes through, in order (INIT -> RUN -> EVAL); ErrorStage: where else a job
can fail. Both are str enums, so each goes on the wire as its value (`"run"`, `"final_result"`)."""

from __future__ import annotations

from enum import StrEnum


class Stage(StrEnum):
    """A pipeline stage; its value is the name used on the wire (`"init"`, `"run"`, `"eval"`)."""

    INIT = "init"
    RUN = "run"
    EVAL = "eval"

    @property
    def next(self) -> Stage | None:
        """The stage after this one; None after EVAL."""
        order = list(Stage)
        index = order.index(self) + 1
        return order[index] if index < len(order) else None

    @property
    def exception_hook(self) -> str:
        """Name of the handler method called when this stage raises (`init_exception`, ...)."""
        return f"{self.value}_exception"


STAGES: tuple[Stage, ...] = tuple(Stage)
"""The stages in order."""


class ErrorStage(StrEnum):
    """`ErrorInfo.stage` of a job that failed outside its three stages."""

    FINAL_RESULT = "final_result"  # the handler's final_result() raised, timed out or returned no JobResult
    RESULT = "result"  # the result could not be built (artifacts or eval details are not JSON)
    RESTART = "restart"  # the job was in flight when the server died (the results journal, on restart)
