"""optuna-dashboard serves a finished search with its constraints and metric names."""

from __future__ import annotations

import json
from typing import Any
from wsgiref.util import setup_testing_defaults

import optuna_dashboard
from search_landscape import Landscape

from tss_opt.search import run_search
from tss_opt.storage import open_storage


def _get(app: Any, path: str) -> tuple[str, Any]:
    environ: dict[str, Any] = {}
    setup_testing_defaults(environ)
    environ.update(REQUEST_METHOD="GET", PATH_INFO=path, QUERY_STRING="")
    seen: dict[str, str] = {}

    def start_response(status: str, headers: list, exc_info: Any = None) -> None:
        seen["status"] = status

    body = b"".join(app(environ, start_response))
    return seen["status"], json.loads(body)


def test_dashboard_api_shows_constraints_and_metric_names(tmp_path, study_name: str) -> None:
    url = f"sqlite:///{tmp_path / 'tss.db'}"
    result = run_search(
        Landscape(8, 0), storage=url, study_name=study_name, max_depth=2, show_progress=False
    )
    app = optuna_dashboard.wsgi(open_storage(url))

    status, studies = _get(app, "/api/studies")
    assert status.startswith("200")
    (summary,) = [s for s in studies["study_summaries"] if s["study_name"] == study_name]
    assert summary["directions"] == ["maximize", "maximize", "minimize"]

    status, detail = _get(app, f"/api/studies/{summary['study_id']}")
    assert status.startswith("200")
    assert detail["objective_names"] == ["accept_length", "f1", "cost"]
    trials = detail["trials"]
    assert len(trials) == len(result.trials)
    feasible_by_set = {r.skip_set: r.feasible for r in result.trials}
    n_infeasible = 0
    for t in trials:
        attrs = {a["key"]: a["value"] for a in t["user_attrs"]}
        skip = frozenset(json.loads(attrs["skip_set"]))
        assert t["state"] == "Complete"
        assert len(t["constraints"]) == 2
        # The dashboard marks a trial infeasible when a constraint value is > 0.
        infeasible = any(c > 0 for c in t["constraints"])
        assert infeasible == (not feasible_by_set[skip])
        n_infeasible += infeasible
        assert len(t["params"]) == 8 and len(t["values"]) == 3
        assert {"level", "sparsity", "tokens_per_s", "feasible"} <= set(attrs)
    assert 0 < n_infeasible < len(trials)
    # Study user attributes (settings, metadata) are listed too.
    assert {a["key"] for a in detail["user_attrs"]} >= {"search_settings", "metadata", "result"}
