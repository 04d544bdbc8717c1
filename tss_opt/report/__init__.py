"""Reports: the held-out comparison (native vs TSS per domain) and figures of a search study.

- :func:`run_heldout` / :func:`compare_domain` measure both methods on the held-out prompts,
  interleaved per prompt; :func:`write_report` writes ``heldout.md`` and ``heldout.json``.
- :func:`assess` adds paired intervals (:mod:`tss_opt.report.intervals`), the validation
  prediction and the verdict (:mod:`tss_opt.report.assessment`) to a comparison.
- :func:`plot_single_layer_profile` (paper's Figure 3) and :func:`plot_pareto` draw a study;
  :func:`plot_speedup` the report's speedups with their intervals.

See ``docs/report.md``; the command is ``python -m tss_opt.cli.report``.
"""

from tss_opt.report.assessment import (
    DomainVerdict,
    HeldoutStats,
    ValidationPrediction,
    domain_verdict,
    heldout_stats,
    validation_prediction,
)
from tss_opt.report.heldout import (
    DomainComparison,
    HeldoutReport,
    ReportError,
    add_study_plots,
    assess,
    compare_domain,
    measure_native,
    run_heldout,
    study_storage,
    write_report,
)
from tss_opt.report.intervals import Interval, bootstrap_ratio, paired_difference
from tss_opt.report.plots import PlotError, plot_pareto, plot_single_layer_profile, plot_speedup
from tss_opt.report.tables import (
    format_skip_set,
    markdown_report,
    markdown_table,
    report_to_dict,
    validation_table,
)

__all__ = [
    "DomainComparison",
    "DomainVerdict",
    "HeldoutReport",
    "HeldoutStats",
    "Interval",
    "PlotError",
    "ReportError",
    "ValidationPrediction",
    "add_study_plots",
    "assess",
    "bootstrap_ratio",
    "compare_domain",
    "domain_verdict",
    "format_skip_set",
    "heldout_stats",
    "markdown_report",
    "markdown_table",
    "measure_native",
    "paired_difference",
    "plot_pareto",
    "plot_single_layer_profile",
    "plot_speedup",
    "report_to_dict",
    "run_heldout",
    "study_storage",
    "validation_prediction",
    "validation_table",
    "write_report",
]
