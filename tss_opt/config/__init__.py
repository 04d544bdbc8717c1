"""Configuration: dataclass schemas (Hydra ConfigStore) and the location of ``conf/``."""

from tss_opt.config.paths import config_dir
from tss_opt.config.schema import SearchPreset, TSSConfig, register_configs

__all__ = ["SearchPreset", "TSSConfig", "config_dir", "register_configs"]
