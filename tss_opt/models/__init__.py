"""Target models as configuration: loading, the embedded default and the tiny test model."""

from tss_opt.config.model import ModelConfig, TinyConfig
from tss_opt.models.loading import (
    LoadedModel,
    ModelLoadError,
    as_model_config,
    load_model,
    model_id_for,
)

__all__ = [
    "LoadedModel",
    "ModelConfig",
    "ModelLoadError",
    "TinyConfig",
    "as_model_config",
    "load_model",
    "model_id_for",
]
