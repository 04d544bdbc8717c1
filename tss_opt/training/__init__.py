"""Training drafters for a target by self-distillation: the training text of a domain
(:mod:`~tss_opt.training.data`), the target's features of it (:mod:`~tss_opt.training.features`),
the EAGLE-1 head trainer (:mod:`~tss_opt.training.eagle`) and T2D, a drafter pruned and
distilled from the target (:mod:`~tss_opt.training.t2d`, imported on demand). The command
``python -m tss_opt.cli.train_drafter`` hands one run's values
(:class:`~tss_opt.training.job.TrainingJob`) to the trainer of the chosen drafter
(:mod:`~tss_opt.training.trainers`, imported on demand)."""

from tss_opt.training.common import (
    Budget,
    TrainingDataError,
    TrainingSettingsError,
    check_settings,
    write_atomically,
)
from tss_opt.training.data import TrainingText, build_training_text
from tss_opt.training.domain_text import DomainText, domain_text
from tss_opt.training.eagle import (
    EagleTrainResult,
    LossParts,
    TrainingInterrupted,
    evaluate_loss,
    probe_accept_length,
    save_checkpoint,
    train_eagle,
)
from tss_opt.training.features import FeatureSet, extract_features

__all__ = [
    "Budget",
    "DomainText",
    "EagleTrainResult",
    "FeatureSet",
    "LossParts",
    "TrainingDataError",
    "TrainingInterrupted",
    "TrainingSettingsError",
    "TrainingText",
    "build_training_text",
    "check_settings",
    "domain_text",
    "evaluate_loss",
    "extract_features",
    "probe_accept_length",
    "save_checkpoint",
    "train_eagle",
    "write_atomically",
]
