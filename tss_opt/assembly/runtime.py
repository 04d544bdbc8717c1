"""The loaded target with its drafter factory (:class:`Assembly`): what every decoding command needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from tss_opt.assembly.settings import base_protocol, build_verifier, drafter_config, model_settings

if TYPE_CHECKING:
    from tss_opt.decoding import Drafter, TargetModel
    from tss_opt.decoding.drafters.building import WeightCache
    from tss_opt.decoding.protocol import DecodeProtocol
    from tss_opt.models import LoadedModel
    from tss_opt.models.precision import Purpose


@dataclass
class Assembly:
    """A loaded target with its drafter factory: what every decoding command needs.

    Attributes:
        loaded: The model, its tokenizer and config.
        target: The verifier with its skip mechanism.
        drafter_cfg: The drafter's config (``conf/drafter/<name>.yaml`` with overrides).
        weights: Weights drafters only read (draft models, EAGLE heads), loaded once for every
            drafter this assembly builds (the evaluator builds one per trial).
    """

    loaded: LoadedModel
    target: TargetModel
    drafter_cfg: dict[str, Any]
    weights: WeightCache | None = None

    def new_drafter(self) -> Drafter | None:
        """A fresh drafter (its own state); weights it only reads are shared through :attr:`weights`."""
        from tss_opt.decoding.drafters import build_drafter
        from tss_opt.decoding.drafters.building import WeightCache

        if self.weights is None:
            self.weights = WeightCache()
        return build_drafter(self.drafter_cfg, self.target, self.loaded, weights=self.weights)

    @property
    def eos_token_ids(self) -> list[int]:
        """The loaded model's stop tokens (:attr:`LoadedModel.eos_token_ids`)."""
        return self.loaded.eos_token_ids


def assemble(cfg: DictConfig, purpose: Purpose = "decode") -> Assembly:
    """Load the configured model and wrap it as a skippable target with its drafter config.

    ``purpose``: what ``dtype: auto`` resolves for (:func:`model_settings`): ``decode`` for
    commands that generate or serve, ``search`` for those that measure a study's figures."""
    from tss_opt.decoding import TargetModel
    from tss_opt.decoding.compiled import CompiledTarget
    from tss_opt.models import load_model

    loaded = load_model(model_settings(cfg, purpose))
    kind = CompiledTarget if cfg.get("compile") else TargetModel  # compile=true (docs/engine.md, "Compiled step")
    target = kind(loaded.model, layers_path=loaded.config.layers_path, max_context=loaded.config.max_context)
    return Assembly(loaded=loaded, target=target, drafter_cfg=drafter_config(cfg))


def serving_protocol(cfg: DictConfig, runtime: Assembly) -> DecodeProtocol:
    """The runtime's protocol: :func:`base_protocol` (``max_new_tokens=`` is the default
    request length; each domain has its own system prompt) with the configured rule."""
    return base_protocol(cfg, runtime.eos_token_ids).replace(verification=build_verifier(cfg, runtime.drafter_cfg))
