"""``python -m tss_opt.cli.sweep +domain=NAME [sweep_tolerances=[0.05,0,-0.05,-0.1,-0.2]]``

The tolerance sweep (the paper's Table 4): one search per tolerance with eps_A = eps_M =
tau_A = tau_M set from it, the other settings from the ``search`` preset. Tolerances use the
paper's sign: ``-0.05`` ("-5%") allows a 5 % drop (our ``eps = 0.05``), ``+0.05`` ("+5%")
requires a 5 % gain (our ``eps = -0.05``). Writes ``sweep_<domain>.md`` / ``.json`` into
``report_dir``; held-out columns when ``heldout_prompts`` > 0. See docs/compare.md.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from tss_opt.assembly import assemble, require_domain
from tss_opt.cli.common import hydra_entry
from tss_opt.cli.compare import (
    HeldoutSets,
    calibration_evaluator,
    hide_replay_speed,
    log_shared,
    run_study,
    with_search,
)
from tss_opt.errors import UsageError


def label(t: float) -> str:
    """``0.05`` -> ``+5%``, ``-0.1`` -> ``-10%``, ``0`` -> ``0%``."""
    pct = round(100 * t, 6)
    return f"{pct:+g}%" if pct else "0%"


def sweep(cfg: DictConfig) -> list[Any]:
    from tss_opt.assembly import search_settings
    from tss_opt.report.compare import row_from_result, sweep_markdown, write_rows

    tolerances = [float(t) for t in (cfg.get("sweep_tolerances") or [])]
    if not tolerances:
        raise UsageError("sweep_tolerances is empty; e.g. sweep_tolerances=[0.05,0,-0.05,-0.1,-0.2]")
    bad = [t for t in tolerances if not -1 < t < 1]
    if bad:
        raise UsageError(f"sweep_tolerances {bad} out of range; expected -1 < t < 1 (paper's sign: -0.05 allows a 5% drop)")
    if not cfg.search.relative:
        raise UsageError("the sweep needs search.relative=true (a required gain is a relative tolerance)")
    domain = require_domain(cfg)
    configs = []
    for t in tolerances:
        eps = 0.0 - t  # paper's "-5%" (t = -0.05) is our eps = 0.05
        c = with_search(cfg, eps_accept=eps, eps_metric=eps, tau_accept=eps, tau_metric=eps)
        search_settings(c)  # validate before loading the model
        configs.append((t, eps, c))
    rt = assemble(cfg, "search")  # measures a study's figures: dtype=auto keeps its precision
    evaluator = calibration_evaluator(cfg, rt)
    heldout = HeldoutSets(cfg, rt)
    rows = []
    for t, eps, c in configs:
        row = row_from_result(label(t), run_study(c, evaluator))
        heldout.add(row.skip_set)
        row.settings = {"tolerance": t, "eps_accept": eps, "eps_metric": eps, "tau_accept": eps, "tau_metric": eps}
        rows.append(row)
    heldout.fill(rows)
    log_shared(evaluator)
    metric = getattr(evaluator, "metric_name", "metric")
    note = hide_replay_speed(cfg, rows, evaluator)
    md = sweep_markdown(rows, metric_name=metric, domain=domain.name)
    if note:
        md += "\n\n" + note
    meta = {"domain": domain.name, "model": rt.loaded.model_id, "mode": cfg.search.mode, "metric": metric,
            "heldout_prompts": heldout.prompts}
    paths = write_rows(rows, md, cfg.report_dir, f"sweep_{domain.name}", meta)
    print(md)
    print()
    for path in paths.values():
        print(f"wrote {path}")
    return rows


main = hydra_entry(sweep)

if __name__ == "__main__":
    main()
