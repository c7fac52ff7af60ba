"""Trajectory-aware scheduling (Heddle): a progressive length predictor, its accuracy metrics, and
presorted dynamic-programming placement with migration. Pure algorithms: nothing here imports the pipeline.
"""

from prorl_server.scheduling.accuracy import Accuracy, accuracy_at_step, pearson, recall_at_top, replay
from prorl_server.scheduling.migration import LiveTrajectory, Migration, plan_migrations, scaled_targets
from prorl_server.scheduling.partition import Placement, partition_makespan, place
from prorl_server.scheduling.predictor import (
    PREDICTORS,
    LengthPredictor,
    NoPredictor,
    OnlinePredictor,
    SourceMeanPredictor,
    make_predictor,
)
from prorl_server.scheduling.profile import Profile
from prorl_server.scheduling.view import Prediction, TrajectoryView, prompt_key_of, view_of

__all__ = [
    "PREDICTORS",
    "Accuracy",
    "LengthPredictor",
    "LiveTrajectory",
    "Migration",
    "NoPredictor",
    "OnlinePredictor",
    "Placement",
    "Prediction",
    "Profile",
    "SourceMeanPredictor",
    "TrajectoryView",
    "accuracy_at_step",
    "make_predictor",
    "partition_makespan",
    "pearson",
    "place",
    "plan_migrations",
    "prompt_key_of",
    "recall_at_top",
    "replay",
    "scaled_targets",
    "view_of",
]
