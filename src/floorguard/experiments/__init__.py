"""The experiment suite: design §10's catalogue as declarative grids, run over a process pool."""

from floorguard.experiments.catalogue import catalogue
from floorguard.experiments.conditions import Condition, run_condition
from floorguard.experiments.runner import ExperimentResult, run_experiments
from floorguard.experiments.spec import Experiment

__all__ = [
    "Condition",
    "Experiment",
    "ExperimentResult",
    "catalogue",
    "run_condition",
    "run_experiments",
]
