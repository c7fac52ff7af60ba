"""Trajectory-aware scheduling (Heddle): a progressive length predictor, its accuracy metrics, presorted
dynamic-programming placement with migration, heterogeneous workers (heterogeneous.py), dispatch policies and per-trajectory telemetry. Pure algorithms:
nothing here imports the pipeline.
"""

from prorl_server.scheduling.accuracy import Accuracy, accuracy_at_step, pearson, recall_at_top, replay
from prorl_server.scheduling.dispatch import DISPATCH_POLICIES, DispatchPolicy
from prorl_server.scheduling.heterogeneous import (
    DEFAULT_PARALLEL_EFFICIENCY,
    Allocation,
    WorkerPlacement,
    anneal_allocation,
    parallel_profile,
    place_on_workers,
)
from prorl_server.scheduling.latency_profile import DEFAULT_PROFILE, LatencyProfile
from prorl_server.scheduling.migration import LiveTrajectory, Migration, plan_migrations, scaled_targets
from prorl_server.scheduling.partition import Placement, partition_makespan, place
from prorl_server.scheduling.placement_runtime import SharedPredictor, TrajectoryPlacer
from prorl_server.scheduling.predictor import (
    PREDICTORS,
    LengthPredictor,
    NoPredictor,
    OnlinePredictor,
    SourceMeanPredictor,
    make_predictor,
)
from prorl_server.scheduling.profile import Profile
from prorl_server.scheduling.profile_file import FORMAT, ProfileFile, is_profile_path, read_profile_file
from prorl_server.scheduling.telemetry import TelemetrySnapshot, TrajectoryTelemetry
from prorl_server.scheduling.view import Prediction, TrajectoryView, prompt_key_of, view_of

__all__ = [
    "DEFAULT_PARALLEL_EFFICIENCY",
    "DEFAULT_PROFILE",
    "DISPATCH_POLICIES",
    "FORMAT",
    "PREDICTORS",
    "Accuracy",
    "Allocation",
    "DispatchPolicy",
    "LatencyProfile",
    "LengthPredictor",
    "LiveTrajectory",
    "Migration",
    "NoPredictor",
    "OnlinePredictor",
    "Placement",
    "Prediction",
    "Profile",
    "ProfileFile",
    "SharedPredictor",
    "SourceMeanPredictor",
    "TelemetrySnapshot",
    "TrajectoryPlacer",
    "TrajectoryTelemetry",
    "TrajectoryView",
    "WorkerPlacement",
    "accuracy_at_step",
    "anneal_allocation",
    "is_profile_path",
    "make_predictor",
    "parallel_profile",
    "partition_makespan",
    "pearson",
    "place",
    "place_on_workers",
    "plan_migrations",
    "prompt_key_of",
    "read_profile_file",
    "recall_at_top",
    "replay",
    "scaled_targets",
    "view_of",
]
