"""Target models as configuration: loading, the embedded default and the tiny test model."""

from tss_opt.models.config import ModelConfig, TinyConfig
from tss_opt.models.loading import LoadedModel, ModelLoadError, load_model

__all__ = ["LoadedModel", "ModelConfig", "ModelLoadError", "TinyConfig", "load_model"]
