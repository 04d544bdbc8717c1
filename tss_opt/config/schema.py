"""Structured configs: dataclass schemas registered in Hydra's ConfigStore; YAML gives values.

A misspelt key or a wrong type fails at compose time. Every command (search, generate,
export, launch, report, serve) composes the same tree from ``conf/config.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

from tss_opt.config.domain import DomainConfig
from tss_opt.config.enums import Cost, ExportFormat, GGUFOutType, Scope, ServeBackend, Verification
from tss_opt.config.model import ModelConfig
from tss_opt.config.search import SearchSettings
from tss_opt.config.serve import ServeSettings
from tss_opt.config.train import TrainSettings

REPORT_LEVEL = 0.9
"""Two-sided coverage of the report's paired intervals (``report_confidence``; docs/report.md)."""
REPORT_RESAMPLES = 2000
"""Paired bootstrap resamples of the report's ratio intervals (``report_bootstrap``)."""
RELAXED_WEIGHTS: tuple[float, ...] = (1.0, 0.8, 0.6, 0.4, 0.2)
"""``tune_verification``'s grid of DIVERSED weights (``relaxed.weights``)."""


@dataclass
class SearchPreset(SearchSettings):
    """Algorithm-1 settings plus the protocol knobs a preset may shrink.

    Attributes:
        preset: the preset's name (``conf/search/<preset>.yaml``), shown in logs and docs.
        prompts: calibration prompts evaluated per trial; ``None`` = the domain's
            ``calibration_size`` (the paper: 16).
        max_new_tokens: tokens generated per prompt; ``None`` = the domain's (paper: 96).
        note: a line printed at start (the CPU preset says what it reduced).
        validation_candidates: after the search, the K cheapest feasible sets are checked on
            the domain's validation split (paired against dense) before the mapping is
            written; 0 skips the check.
        validation_prompts: validation prompts used; ``None`` = the domain's
            ``validation_size`` (16).
    """

    preset: str = "custom"
    prompts: int | None = None
    max_new_tokens: int | None = None
    note: str | None = None
    validation_candidates: int = 3
    validation_prompts: int | None = None


@dataclass
class RelaxedSettings:
    """Settings of the lossy verification modes (``verification=diversed|cospec``).

    Attributes:
        weight: DIVERSED's target share ``w`` in [0, 1] of the blend
            ``w * p_target + (1 - w) * p_draft`` (1 = exact); searched per domain by
            ``python -m tss_opt.cli.tune_verification`` (tss_opt.training.relaxed.search_weight).
        tau_draft, tau_target: CoSpec's threshold baseline: keep the draft token ``x`` at a
            mismatch when ``p_draft(x) > tau_draft`` and ``p_target(x) > tau_target``.
        policy: a learned CoSpec policy (JSON from ``train_cospec_policy``); ``None`` = the
            threshold baseline.
        weight_policy: a learned, context-dependent DIVERSED weight (JSON from
            ``train_diversed_weight``); replaces ``weight`` when set.
        weights: ``tune_verification``: DIVERSED's grid of fixed weights.
        epochs, lr, step_cost, sigma, init_weight, seed: ``tune_verification``'s REINFORCE
            (CoSpec policy and learned DIVERSED weight): passes over the calibration prompts,
            step size, the steps-per-token cost in the reward, the DIVERSED weight's exploration
            noise (logits) and starting weight, the exploration seed.
        out_dir: where ``tune_verification`` saves learned parameters (JSON).
    """

    weight: float = 0.5
    tau_draft: float = 0.6
    tau_target: float = 0.15
    policy: str | None = None
    weight_policy: str | None = None
    # tune_verification (python -m tss_opt.cli.tune_verification)
    weights: list[float] = field(default_factory=lambda: list(RELAXED_WEIGHTS))
    epochs: int = 4
    lr: float = 2.0
    step_cost: float = 0.1
    sigma: float = 1.0
    init_weight: float = 0.8
    seed: int = 0
    out_dir: str = "storage/relaxed"


@dataclass
class TSSConfig(ServeSettings):
    """The whole configuration tree (``conf/config.yaml``); the HTTP server's keys (``host``,
    ``port``, ``api_key``...) come from :class:`~tss_opt.config.serve.ServeSettings`."""

    model: ModelConfig = field(default_factory=ModelConfig)
    domain: DomainConfig | None = None
    drafter: Any = None  # conf/drafter/*.yaml; None = the model's default_drafter
    search: SearchPreset = field(default_factory=SearchPreset)
    # conf/evaluator/*.yaml: kind (engine, replay, auto) and its settings, or _target_ naming
    # your own factory (any keys then)
    evaluator: Any = field(default_factory=lambda: {"kind": "engine", "_target_": None})

    storage: str | None = None  # SQL URL; None = sqlite:///storage/tss.db
    study_name: str | None = None  # None = derived from model, drafter, domain, split, settings
    split: str = "calibration"  # calibration (the search), validation or heldout
    scope: Scope = Scope.verify
    temperature: float = 0.0
    # The acceptance rule: exact (lossless, the default); diversed or cospec are lossy by
    # design (docs/engine.md, "Relaxed verification"); their settings live under relaxed.
    verification: Verification = Verification.exact
    relaxed: RelaxedSettings = field(default_factory=RelaxedSettings)
    cost: Cost = Cost.analytic
    # Single-request verification through one torch.compile'd decoder layer over preallocated
    # caches (decoding/compiled.py), same tokens. What it gains, where, and why it is off by
    # default: docs/engine.md, "Compiled step".
    compile: bool = False
    reuse_prefill: bool = True  # scope=verify: prefill each prompt once per process, copy per trial
    prefill_store_gib: float = 8.0  # byte budget of the kept prefills (LRU); docs/engine.md has the arithmetic
    device: str | None = None  # shortcut for model.device (e.g. cuda:1)
    dtype: str | None = None  # shortcut for model.dtype (e.g. bfloat16, or auto: tss_opt.models.precision)
    threads: int | None = None  # torch CPU threads; None = torch's default
    mapping_path: str = "storage/mapping.yaml"
    write_mapping: bool = True
    log_level: str = "INFO"

    # generate / serve
    prompt: str | None = None
    skip: list[int] = field(default_factory=list)
    max_new_tokens: int | None = None
    request_domain: str | None = None  # serve: the request's domain label (None = detect)
    serve_lossy_entries: bool = True  # serve: a lossy mapping entry under its own rule (false: under verification)
    backend: ServeBackend = ServeBackend.native  # serve: native (our server) or vllm (vLLM's server with the TSS plugin)
    vllm_args: list[str] = field(default_factory=list)  # serve backend=vllm: vLLM's own options, as given (also after `--`)

    # evaluate
    json_out: str | None = None  # write the aggregate and per_prompt as JSON to this path

    # export_model: the domain's sparse target as a Hugging Face checkpoint or a GGUF file (docs/mapping.md)
    out: str | None = None  # format=hf: the checkpoint folder (new or empty); format=gguf: the folder of <model>-<domain>.gguf
    force: bool = False  # export an entry searched with scope=verify anyway (it then differs from the served target)
    format: ExportFormat = ExportFormat.hf  # hf (a checkpoint folder) or gguf (one file for llama.cpp / Ollama)
    outtype: GGUFOutType | None = None  # format=gguf: f32 (default), f16, bf16 or q8_0
    gguf_source: str | None = None  # format=gguf: the dense GGUF to cut (default: the embedded model's own file)

    # launch: one local worker per listed device
    devices: list[str] = field(default_factory=list)

    # report
    report_dir: str = "storage/report"
    report_domains: list[str] = field(default_factory=list)  # [] = every domain in the mapping
    heldout_prompts: int | None = None  # None = the domain's heldout_size (48); compare/sweep: 0 = none
    report_confidence: float = REPORT_LEVEL  # two-sided coverage of the paired intervals (docs/report.md)
    report_bootstrap: int = REPORT_RESAMPLES  # paired bootstrap resamples for the ratio intervals (speedup, A ratio)
    report_seed: int = 0  # seed of that bootstrap: the same seed gives the same intervals

    # compare: search strategies run on one domain with one budget (search.max_trials)
    strategies: list[str] = field(default_factory=list)
    # train_drafter: budget, optimiser, data and probe (tss_opt/config/train.py)
    train: TrainSettings = field(default_factory=TrainSettings)

    # sweep: tolerances in the paper's sign (-0.05 allows a 5 % drop, +0.05 requires a 5 % gain)
    sweep_tolerances: list[float] = field(default_factory=lambda: [0.05, 0.0, -0.05, -0.10, -0.20])


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="tss_schema", node=TSSConfig)
