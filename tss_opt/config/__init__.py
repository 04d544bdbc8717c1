"""Configuration: dataclass schemas (Hydra ConfigStore), string settings as Enums, and the
location of ``conf/``. Importing it loads no model, metric or database library."""

from tss_opt.config.domain import DomainConfig
from tss_opt.config.enums import Cost, Scope, StrEnum, Verification
from tss_opt.config.model import ModelConfig, TinyConfig
from tss_opt.config.paths import config_dir
from tss_opt.config.schema import SearchPreset, TSSConfig, register_configs
from tss_opt.config.search import Mode, SearchSettings, Selection
from tss_opt.config.train import TrainSettings

__all__ = [
    "Cost",
    "DomainConfig",
    "Mode",
    "ModelConfig",
    "Scope",
    "SearchPreset",
    "SearchSettings",
    "Selection",
    "StrEnum",
    "TSSConfig",
    "TinyConfig",
    "TrainSettings",
    "Verification",
    "config_dir",
    "register_configs",
]
