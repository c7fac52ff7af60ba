"""The errors of the verl agent loop (training/verl_agent_loop.py), kept apart from it: that module imports
verl, which the server's environment lacks, and the error tree's test imports every module it can."""

from __future__ import annotations

from prorl_server.errors import TrainerError


class VerlRolloutError(TrainerError):
    """The verl agent loop could not turn a sample into a rollout."""


class UnknownTaskSource(VerlRolloutError, LookupError):
    """The server has no handler for the sample's `data_source`."""

    def __init__(self, data_source: str, detail: str) -> None:
        super().__init__(f"prorl-server has no handler for the data_source {data_source!r}: {detail}")
        self.data_source = data_source


class RolloutFailed(VerlRolloutError, RuntimeError):
    """A rollout did not complete and the agent loop was told to raise (`fail_on_error`)."""
