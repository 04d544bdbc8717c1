"""``python -m tss_opt.cli.evaluate +domain=NAME [skip=[...]] [split=calibration]``

Runs the trial evaluator once (one skip set, every prompt of a split, the domain's protocol
unless ``search.prompts`` / ``max_new_tokens`` / ``search.max_new_tokens`` are given on the
command line or ``search=custom``) and prints A, M, C and tokens/s. A search preset's own
reductions (search=cpu's 4 prompts x 32 tokens) apply to searches, not to ``evaluate``.
"""

from __future__ import annotations

from omegaconf import DictConfig

from tss_opt.cli.common import (
    build_evaluator,
    check_prompts,
    hydra_entry,
    load_runtime,
    max_new_tokens_for,
    require_domain,
)
from tss_opt.evaluation.evaluator import EvalResult


def _given(cfg: DictConfig, key: str) -> bool:
    """Whether ``key`` was set on the command line (or the preset is ``custom``)."""
    if cfg.search.get("preset") == "custom":
        return True
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = HydraConfig.get().overrides.task
    except ValueError:  # called without Hydra (tests): only the config's values count
        return False
    return any(o.split("=", 1)[0].lstrip("+~") == key for o in overrides)


def evaluate(cfg: DictConfig) -> EvalResult:
    domain = require_domain(cfg)
    # The search preset's prompt/token reductions apply to searches; a plain evaluation
    # follows the domain's protocol unless search.prompts / max_new_tokens are given.
    prompts = check_prompts(cfg.search.prompts) if _given(cfg, "search.prompts") else None
    max_new = max_new_tokens_for(cfg, domain)  # checked before the model loads
    if not (cfg.get("max_new_tokens") is not None or _given(cfg, "search.max_new_tokens")):
        max_new = domain.config.max_new_tokens
    rt = load_runtime(cfg)
    ev = build_evaluator(cfg, runtime=rt, prompts=prompts or len(domain.split(cfg.split)))
    ev.max_new_tokens = max_new
    r = ev.evaluate(frozenset(cfg.skip))
    print(
        f"| domain | model | drafter | dtype | split | prompts | tokens | skip | accepted length | {ev.metric_name} | cost | tok/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {domain.name} | {rt.loaded.config.name} | {rt.drafter_cfg.get('name')} | {rt.loaded.config.dtype} | "
        f"{cfg.split} | {len(ev.examples)} | {ev.max_new_tokens} | {sorted(r.skip)} | {r.accept_length:.3f} | "
        f"{r.metric:.4f} | {r.cost:.4f} | {r.tokens_per_s:.2f} |"
    )
    for k, v in r.metric_extras.items():
        print(f"{k}: {v:.4f}")
    return r


main = hydra_entry(evaluate)

if __name__ == "__main__":
    main()
