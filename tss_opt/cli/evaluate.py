"""``python -m tss_opt.cli.evaluate +domain=NAME [skip=[...]] [split=calibration] [json_out=PATH]``

Runs the trial evaluator once (one skip set, every prompt of a split: ``calibration``,
``validation`` or ``heldout``; the domain's protocol unless ``search.prompts`` /
``max_new_tokens`` say otherwise) and prints A, M, C and tokens/s. With ``json_out=PATH`` it
also writes the aggregate and the per-prompt figures (``per_prompt``) as JSON.
The domain's protocol applies unless ``search.prompts`` / ``max_new_tokens`` /
``search.max_new_tokens`` are given on the command line or ``search=custom``: a search
preset's own reductions (search=cpu's prompts x tokens) apply to searches, not to ``evaluate``.
"""

from __future__ import annotations

from omegaconf import DictConfig

from tss_opt.assembly import (
    assemble,
    build_evaluator,
    check_prompts,
    max_new_tokens_for,
    prompt_set,
    require_domain,
)
from tss_opt.cli.common import hydra_entry
from tss_opt.evaluation.evaluator import EvalResult
from tss_opt.evaluation.result_json import check_json_out, write_result_json
from tss_opt.progress import prompt_bar


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
    if cfg.get("json_out"):
        check_json_out(cfg.json_out)  # before the (long) evaluation
    # The search preset's prompt/token reductions apply to searches; a plain evaluation
    # follows the domain's protocol unless search.prompts / max_new_tokens are given.
    prompts = check_prompts(cfg.search.prompts) if _given(cfg, "search.prompts") else None
    max_new = max_new_tokens_for(cfg, domain)  # checked before the model loads
    if not (cfg.get("max_new_tokens") is not None or _given(cfg, "search.max_new_tokens")):
        max_new = domain.config.max_new_tokens
    rt = assemble(cfg)
    ps = prompt_set(cfg, rt, domain, count=prompts or len(domain.split(cfg.split)))
    ev = build_evaluator(
        cfg, "engine", runtime=rt, prompts=ps.replace(protocol=ps.protocol.replace(max_new_tokens=max_new))
    )
    with prompt_bar(len(ev.examples), f"{domain.name} skip {sorted(cfg.skip)}"):
        r = ev.evaluate(frozenset(cfg.skip))
    print(
        f"| domain | model | drafter | dtype | split | prompts | tokens | skip | accepted length | {ev.metric_name} | "
        f"cost ({r.cost_kind}) | tok/s (engine) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {domain.name} | {rt.loaded.config.name} | {rt.drafter_cfg.get('name')} | {rt.loaded.config.dtype} | "
        f"{cfg.split} | {len(ev.examples)} | {ev.max_new_tokens} | {sorted(r.skip)} | {r.accept_length:.3f} | "
        f"{r.metric:.4f} | {r.cost:.4f} | {r.tokens_per_s:.2f} |"
    )
    for k, v in r.metric_extras.items():
        print(f"{k}: {v:.4f}")
    if r.lossy:  # a relaxed rule: the metric is not the target's own (compare with exact)
        print(f"verification: {r.verification} (LOSSY: compare the metric with verification=exact)")
    if cfg.get("json_out"):
        context = {
            "domain": domain.name, "model": rt.loaded.config.name, "drafter": rt.drafter_cfg.get("name"),
            "dtype": rt.loaded.config.dtype, "split": cfg.split, "prompts": len(ev.examples),
            "max_new_tokens": ev.max_new_tokens, "scope": ev.scope, "temperature": ev.temperature,
            "metric_name": ev.metric_name, "verification": r.verification, "lossy": r.lossy,
        }
        path = write_result_json(cfg.json_out, r, context)
        print(f"wrote {path}")
    return r


main = hydra_entry(evaluate)

if __name__ == "__main__":
    main()
