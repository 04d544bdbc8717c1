"""``python -m tss_opt.cli.report [mapping_path=...] [report_domains=[qa,rag]] [heldout_prompts=8]
[max_new_tokens=32] [storage=URL] [report_dir=storage/report] [report_confidence=0.9]
[report_bootstrap=2000] [report_seed=0]``

The held-out evaluation of a mapping: for each mapped domain (or ``report_domains``), the
held-out prompts run with the dense target and with the domain's skip set, interleaved per
prompt, with the same drafter (native only where the mapping keeps dense). Paired intervals,
the validation prediction and a verdict per domain (metric tolerance: ``search.eps_metric``,
``search.relative``, ``search.eps_metric_abs``, the search's rule). Writes ``heldout.md`` (the paper's Table 1 layout plus intervals),
``heldout.json``, ``speedup.png`` and, per domain, ``profile_<domain>.png`` and
``pareto_<domain>.png`` from the domain's search study into ``report_dir``. A mapping entry
with a lossy verification rule (``tune_verification``) is measured under that rule and its row
labelled LOSSY with its metric change beside its speedup (the drafter must give
distributions). See docs/report.md.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from tss_opt.assembly import assemble, base_protocol, metric_tolerance
from tss_opt.cli.common import hydra_entry
from tss_opt.config.schema import REPORT_LEVEL, REPORT_RESAMPLES
from tss_opt.config.search_path import domain_config_dirs
from tss_opt.errors import UsageError
from tss_opt.evaluation.domains import Domain, load_domain, read_domain_config
from tss_opt.mapping import DomainMapping, load_mapping

if TYPE_CHECKING:
    from tss_opt.report.heldout import HeldoutReport

log = logging.getLogger("tss_opt.report")


def report_domains(cfg: DictConfig, mapping: DomainMapping) -> list[Domain]:
    """The domains to report on, loaded: ``report_domains`` or every mapped domain.

    A ``+domain=NAME`` config of the same name wins over the shipped one (custom data);
    other names are looked up in the shipped ``conf/`` and every ``--config-dir``.
    """
    names = list(cfg.get("report_domains") or []) or mapping.domains
    if not names:
        raise UsageError(f"the mapping {mapping.path} has no domains; run a search first (python -m tss_opt +domain=NAME)")
    unknown = [n for n in names if mapping.entry_for(n) is None]
    if unknown:
        raise UsageError(
            f"report_domains has {', '.join(map(repr, unknown))} but the mapping {mapping.path} only maps "
            f"{', '.join(mapping.domains) or 'nothing'}; drop them or run their search"
        )
    chosen = cfg.get("domain")
    out = []
    for name in names:
        if chosen is not None and chosen.get("name") == name:
            out.append(load_domain(OmegaConf.to_container(chosen, resolve=True)))  # type: ignore[arg-type]
        else:
            out.append(load_domain(read_domain_config(name, domain_config_dirs())))
    return out


def _level(value: float) -> float:
    from tss_opt.report.intervals import check_level

    try:
        return check_level(value)
    except ValueError as e:
        raise UsageError(str(e)) from e


def report(cfg: DictConfig) -> HeldoutReport:
    from tss_opt.report.heldout import add_study_plots, run_heldout, write_report
    from tss_opt.report.tables import markdown_table

    level = _level(cfg.get("report_confidence", REPORT_LEVEL))  # refuse a bad level before loading anything
    mapping = load_mapping(cfg.mapping_path)
    domains = report_domains(cfg, mapping)
    rt = assemble(cfg, "search")  # measures a study's figures: dtype=auto keeps its precision
    mapping.check_model(rt.loaded.model_id, rt.target.num_layers)
    drafter = rt.drafter_cfg.get("name")
    searched = sorted({e.drafter for e in mapping.entries.values() if e.drafter})
    if drafter and searched and searched != [drafter]:
        log.warning("reporting with drafter %r; the mapping was searched with %s (select it with drafter=NAME)", drafter, ", ".join(searched))
    log.info(
        "held-out report: %s, drafter %s, domains %s -> %s",
        rt.loaded.model_id, drafter, ", ".join(d.name for d in domains), cfg.report_dir,
    )
    result = run_heldout(
        rt.target, rt.loaded.tokenizer, rt.new_drafter, mapping, domains,
        model_id=rt.loaded.model_id, drafter=drafter, protocol=base_protocol(cfg, rt.eos_token_ids),
        prompts=cfg.get("heldout_prompts"), max_new_tokens=cfg.get("max_new_tokens"), level=level,
        resamples=int(cfg.get("report_bootstrap", REPORT_RESAMPLES)), seed=int(cfg.get("report_seed", 0)),
        tolerance=metric_tolerance(cfg),
    )
    for comp in result.domains:
        log.info("plots for %s", comp.domain)
        add_study_plots(comp, cfg.report_dir, cfg.get("storage"))
    paths = write_report(result, cfg.report_dir)
    print(markdown_table(result))
    print()
    for comp in result.domains:
        for path in comp.plots.values():
            print(f"wrote {path}")
    for path in paths.values():
        print(f"wrote {path}")
    return result


main = hydra_entry(report)

if __name__ == "__main__":
    main()
