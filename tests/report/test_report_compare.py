"""Comparison rows, tables and the best-cost plot from synthetic searches."""

from __future__ import annotations

import sys
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "search"))
from search_landscape import Landscape  # noqa: E402

from tss_opt.report.compare import (  # noqa: E402
    best_cost_curve,
    comparison_markdown,
    plot_best_cost,
    row_from_result,
    sweep_markdown,
)
from tss_opt.search import run_search  # noqa: E402


def test_rows_tables_and_plot(tmp_path):
    rows = []
    for mode in ("beam", "random"):
        r = run_search(Landscape(6, 0), storage=optuna.storages.InMemoryStorage(), study_name="s", mode=mode,
                       max_trials=12, show_progress=False)
        curve = best_cost_curve(r)
        assert len(curve) == len(r.trials) and curve[0] == (1, 1.0)  # dense first, feasible
        costs = [c for _, c in curve]
        assert all(a >= b for a, b in zip(costs, costs[1:]))  # best so far only improves
        assert costs[-1] == r.best_record.cost
        rows.append(row_from_result(mode, r))
    md = comparison_markdown(rows, metric_name="f1", domain="qa")
    assert "| beam |" in md and "| random |" in md and "ho f1" in md
    assert "| eps = tau |" in sweep_markdown(rows, metric_name="f1", domain="qa")
    assert plot_best_cost(rows, tmp_path / "p.png", title="t", dense_cost=1.0).stat().st_size > 1000
