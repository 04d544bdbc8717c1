"""``python -m tss_opt.cli.profile +domain=NAME [same overrides as the search]`` or
``python -m tss_opt.cli.profile study_name=NAME``

The single-layer profile (the paper's Figure 3) of any stored study with a level-1 (every
single layer) measurement: writes ``profile_<study>.png`` into ``report_dir`` and prints the
per-layer changes in accepted length and metric against dense. See docs/compare.md.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from tss_opt.cli.common import hydra_entry
from tss_opt.config.objectives import ACCEPT_LENGTH
from tss_opt.errors import UsageError


def profile(cfg: DictConfig) -> Path:
    from tss_opt.report.plots import plot_single_layer_profile
    from tss_opt.search import load_result

    if cfg.get("study_name"):
        name = str(cfg.study_name)
    elif cfg.get("domain") is not None:
        from tss_opt.assembly import study_identity

        name, _ = study_identity(cfg)
    else:
        raise UsageError("no study chosen; add +domain=NAME (with the search's overrides) or study_name=NAME")
    try:
        result = load_result(cfg.storage, name)
    except KeyError:
        raise UsageError(f"no study {name!r} in {cfg.storage or 'sqlite:///storage/tss.db'}; run its search first") from None
    b = result.baseline
    singles = sorted((r for r in result.trials if r.level == 1 and not r.failed), key=lambda r: min(r.skip_set))
    if not singles or not b:
        raise UsageError(f"study {name!r} has no single-layer measurements to plot (its search never ran level 1)")
    m = result.metric_name
    print(f"| layer | accepted length | Δ | {m} | Δ | feasible |")
    print("|---|---|---|---|---|---|")
    for r in singles:
        print(
            f"| {min(r.skip_set)} | {r.accept_length:.3f} | {r.accept_length - b[ACCEPT_LENGTH]:+.3f} | "
            f"{r.metric:.4f} | {r.metric - b['metric']:+.4f} | {'yes' if r.feasible else 'no'} |"
        )
    safe = name.replace("/", "_")
    out = plot_single_layer_profile(result, Path(cfg.report_dir) / f"profile_{safe}.png")
    print(f"wrote {out}")
    return out


main = hydra_entry(profile)

if __name__ == "__main__":
    main()
