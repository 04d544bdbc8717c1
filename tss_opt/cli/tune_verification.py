"""``python -m tss_opt.cli.tune_verification +domain=NAME verification=diversed|cospec
[drafter=self drafter.skip=[...]] [skip=[...]] [relaxed.weights=[1.0,0.6,0.3]] [relaxed.epochs=4]``

Chooses a domain's lossy verification setting on its calibration prompts, as a second stage
after the skip set (docs/engine.md, "Relaxed verification"): ``diversed`` tries the grid of
fixed weights ``relaxed.weights`` and trains the learned, context-dependent weight; ``cospec``
tries the threshold rule (``relaxed.tau_draft``/``relaxed.tau_target``) and trains the learned
arbitration policy. Each runs under the skip set (``skip=[...]``, else the domain's mapping
entry) and is judged by the search's paired metric rule (``search.eps_metric``,
``search.confidence``, ``search.relative``) against dense exact verification; the feasible
one with the highest accepted length is chosen, exact when none keeps the metric.

Prints one row per candidate, saves learned parameters as JSON under
``relaxed.out_dir/<model>/`` and writes the choice into the domain's mapping entry
(``verification``, ``lossy: true``, ``metric_change``, ``relaxed``) when the entry's skip set is
the one tuned under; an entry for which exact is kept stays unchanged.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from tss_opt.assembly import (
    assemble,
    build_evaluator,
    check_distribution_drafter,
    drafter_config,
    metric_tolerance,
    relaxed_config,
    require_domain,
)
from tss_opt.cli.common import hydra_entry
from tss_opt.config import Verification
from tss_opt.config.objectives import ACCEPT_LENGTH
from tss_opt.errors import UsageError

if TYPE_CHECKING:
    from tss_opt.training.relaxed_choice import RelaxedChoice

log = logging.getLogger("tss_opt.tune_verification")


def tune_verification(cfg: DictConfig) -> RelaxedChoice:
    from tss_opt.decoding.skip import validate_skip
    from tss_opt.mapping import load_mapping, write_entry
    from tss_opt.training.relaxed_choice import tune_relaxed

    domain = require_domain(cfg)
    mode = Verification.parse("verification", str(cfg.get("verification") or "exact"))
    if not mode.lossy:
        raise UsageError(
            "tune_verification chooses a lossy rule's setting: add verification=diversed or verification=cospec"
        )
    check_distribution_drafter(mode, drafter_config(cfg))  # before the model loads
    path = Path(cfg.mapping_path)
    mapping = load_mapping(path) if path.exists() else None
    entry = mapping.entry_for(domain.name) if mapping is not None else None
    if cfg.skip:
        skip, source = frozenset(int(i) for i in cfg.skip), "skip="
    elif entry is not None:
        skip, source = entry.skip, f"the mapping entry in {path}"
    else:
        raise UsageError(
            f"no skip set for {domain.name!r}: give skip=[...] or run its search first (no entry in {path}); "
            "skip=[] means 'take it from the mapping'"
        )
    rt = assemble(cfg, "search")  # measures a study's figures: dtype=auto keeps its precision
    if mapping is not None:
        mapping.check_model(rt.loaded.model_id, rt.target.num_layers)
    skip = validate_skip(skip, rt.target.num_layers)
    ev = build_evaluator(cfg, "engine", runtime=rt, split="calibration")
    rs = relaxed_config(cfg)
    log.info(
        "tuning verification=%s for %s on %d calibration prompts x %d tokens, skip %s (from %s), drafter %s",
        mode, domain.name, ev.num_prompts, ev.max_new_tokens, sorted(skip), source, rt.drafter_cfg.get("name"),
    )
    choice = tune_relaxed(
        ev, mode, skip, rs, tolerance=metric_tolerance(cfg), confidence=float(cfg.search.confidence)
    )
    saved = choice.save_learned(Path(rs.out_dir) / rt.loaded.config.name, domain.name)
    print(
        f"## {domain.name}: verification={mode}, skip {sorted(skip)}, {ev.num_prompts} calibration prompts x "
        f"{ev.max_new_tokens} tokens; dense exact A={choice.reference[ACCEPT_LENGTH]:.3f} "
        f"{ev.metric_name}={choice.reference['metric']:.4f}"
    )
    print(choice.table(ev.metric_name))
    for name, rows in choice.history.items():
        for h in rows:
            extra = f"mean w {h['mean_weight']:.2f}" if "mean_weight" in h else f"keep-rate {h['keep_rate']:.2f}"
            print(
                f"{name} REINFORCE epoch {int(h['epoch'])}: reward {h['reward']:.4f} {ev.metric_name} {h['metric']:.4f} "
                f"A {h[ACCEPT_LENGTH]:.3f} {extra}"
            )
    for name, p in saved.items():
        print(f"wrote {p} ({name})")
    chosen = choice.chosen
    if choice.lossy:
        print(
            f"chosen: {chosen.name} = {chosen.label} (LOSSY: {ev.metric_name} change {chosen.judged.metric_change:+.4f} "
            f"vs dense exact, A {chosen.judged.accept_length:.3f})"
        )
    else:
        print("chosen: exact (no relaxed setting kept the metric with a higher accepted length)")
    _write_mapping(cfg, path, entry, skip, choice, write_entry)
    return choice


def _write_mapping(cfg: DictConfig, path: Path, entry, skip, choice: RelaxedChoice, write_entry) -> None:  # noqa: ANN001
    """Record the choice in the domain's mapping entry, or say why not."""
    if not cfg.get("write_mapping", True):
        print("write_mapping=false: the mapping was not changed")
        return
    if entry is None:
        print(f"no mapping entry for this domain in {path}: nothing written (run its search, then tune again)")
        return
    if entry.skip != skip:
        print(
            f"tuned under skip {sorted(skip)} but the mapping entry's skip set is {sorted(entry.skip)}: the mapping "
            "was not changed (tune without skip= to use the entry's)"
        )
        return
    if choice.lossy:
        write_entry(path, replace(entry, verification=choice.chosen.label, relaxed=choice.mapping_block()))
        print(f"{path}: {entry.domain} -> skip {sorted(skip)}, verification {choice.chosen.label} (LOSSY)")
    elif entry.relaxed is not None:
        # A new tuning found no lossy setting that keeps the metric: drop the earlier one.
        write_entry(path, replace(entry, verification="exact", relaxed=None))
        print(f"{path}: {entry.domain}: earlier lossy setting removed, exact verification kept")
    else:
        print(f"{path}: {entry.domain}: exact verification kept, entry unchanged")


main = hydra_entry(tune_verification)

if __name__ == "__main__":
    main()
