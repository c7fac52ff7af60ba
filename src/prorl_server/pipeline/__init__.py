"""The job pipeline: Job, PausableTimer, stage pools, admission, the stage runner, the outcome, the orchestrator
and the result store."""

from prorl_server.pipeline.errors import DuplicateJob, InvalidInstance, NotAccepting, SubmissionError
from prorl_server.pipeline.groups import DuplicateGroup, Group, GroupRunner, wait_done
from prorl_server.pipeline.job import STAGES, Job
from prorl_server.pipeline.loop_lag import PROBE_S, LoopLag, probe
from prorl_server.pipeline.loop_thread import LoopThread
from prorl_server.pipeline.orchestrator import Orchestrator
from prorl_server.pipeline.result_store import ResultStore
from prorl_server.pipeline.stage_pool import StagePool
from prorl_server.pipeline.timer import PausableTimer

__all__ = [
    "PROBE_S",
    "STAGES",
    "DuplicateGroup",
    "DuplicateJob",
    "Group",
    "GroupRunner",
    "InvalidInstance",
    "Job",
    "LoopLag",
    "LoopThread",
    "NotAccepting",
    "Orchestrator",
    "PausableTimer",
    "ResultStore",
    "StagePool",
    "SubmissionError",
    "probe",
    "wait_done",
]
