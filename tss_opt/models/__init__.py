"""Target models as configuration: loading, the embedded default and the tiny test model."""

from tss_opt.config.model import ModelConfig, TinyConfig
from tss_opt.models.loading import (
    LoadedModel,
    ModelLoadError,
    as_model_config,
    load_model,
    model_id_for,
)
from tss_opt.models.precision import (
    AUTO,
    DtypeChoice,
    choose_dtype,
    cpu_flags,
    cpu_vendor,
    resolve_model_dtype,
)

__all__ = [
    "AUTO",
    "DtypeChoice",
    "LoadedModel",
    "ModelConfig",
    "ModelLoadError",
    "TinyConfig",
    "as_model_config",
    "choose_dtype",
    "cpu_flags",
    "cpu_vendor",
    "load_model",
    "model_id_for",
    "resolve_model_dtype",
]
