"""Reports: the held-out comparison (native vs TSS per domain) and figures of a search study.

- :func:`run_heldout` / :func:`compare_domain` measure both methods on the held-out prompts,
  interleaved per prompt; :func:`write_report` writes ``heldout.md`` and ``heldout.json``.
- :func:`plot_single_layer_profile` (paper's Figure 3) and :func:`plot_pareto` draw a study.

See ``docs/report.md``; the command is ``python -m tss_opt.cli.report``.
"""

from tss_opt.report.heldout import (
    DomainComparison,
    HeldoutReport,
    ReportError,
    add_study_plots,
    compare_domain,
    run_heldout,
    study_storage,
    write_report,
)
from tss_opt.report.plots import PlotError, plot_pareto, plot_single_layer_profile
from tss_opt.report.tables import format_skip_set, markdown_report, markdown_table, report_to_dict

__all__ = [
    "DomainComparison",
    "HeldoutReport",
    "PlotError",
    "ReportError",
    "add_study_plots",
    "compare_domain",
    "format_skip_set",
    "markdown_report",
    "markdown_table",
    "plot_pareto",
    "plot_single_layer_profile",
    "report_to_dict",
    "run_heldout",
    "study_storage",
    "write_report",
]
