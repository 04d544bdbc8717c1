"""optuna-dashboard serves a finished search with its constraints and metric names."""

from __future__ import annotations

import json
from typing import Any
from wsgiref.util import setup_testing_defaults

import optuna
import optuna_dashboard
import pytest
from search_landscape import Landscape

from tss_opt.search import load_result, run_search
from tss_opt.search.note import format_note, save_search_note
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


@pytest.mark.timeout(300)
def test_dashboard_server_serves_the_search_note_names_and_constraints(tmp_path, study_name: str) -> None:
    """optuna-dashboard run as a real HTTP server (wsgiref, 127.0.0.1) on a finished search:
    its JSON API serves the search note (levels, S*, Pareto set, stop reason), the objective
    names and each trial's constraints."""
    import threading
    import urllib.request
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    url = f"sqlite:///{tmp_path / 'tss.db'}"
    result = run_search(Landscape(8, 0), storage=url, study_name=study_name, max_depth=2, show_progress=False)

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: Any) -> None:  # no access log in the test output
            pass

    server = make_server("127.0.0.1", 0, optuna_dashboard.wsgi(open_storage(url)), handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_port}"

    def get(path: str) -> Any:
        with urllib.request.urlopen(base + path, timeout=30) as r:
            assert r.status == 200
            return json.loads(r.read())

    try:
        (summary,) = [s for s in get("/api/studies")["study_summaries"] if s["study_name"] == study_name]
        detail = get(f"/api/studies/{summary['study_id']}")
    finally:
        server.shutdown()
        server.server_close()
    note = detail["note"]["body"]
    assert note == format_note(result)
    assert f"## TSS search: {study_name}" in note
    assert f"**Stopped:** {result.stop_reason}" in note and result.stop_reason
    assert f"`{sorted(result.best)}`" in note
    for lv in result.levels:
        assert f"| {lv.level} | {lv.evaluated} / {lv.total} | {lv.feasible} |" in note
    for p in result.pareto:
        assert str(sorted(p)) in note
    assert detail["objective_names"] == ["accept_length", "f1", "cost"]
    assert all(len(t["constraints"]) == 2 for t in detail["trials"])
    assert any(any(c > 0 for c in t["constraints"]) for t in detail["trials"])


def test_note_is_written_once_per_finishing_worker_and_never_fails_a_search(tmp_path, study_name: str, caplog) -> None:
    url = f"sqlite:///{tmp_path / 'tss.db'}"
    run_search(Landscape(8, 0), storage=url, study_name=study_name, max_depth=1, show_progress=False)
    run_search(Landscape(8, 0), storage=url, study_name=study_name, max_depth=1, show_progress=False)  # resumes: finished
    app = optuna_dashboard.wsgi(open_storage(url))
    study_id = optuna.load_study(study_name=study_name, storage=url)._study_id
    status, detail = _get(app, f"/api/studies/{study_id}")
    assert status.startswith("200") and detail["note"]["version"] == 2  # one per finishing worker
    assert detail["note"]["body"] == format_note(load_result(url, study_name))
    broken = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    broken._storage = None  # save_note cannot reach a storage: logged, not raised
    save_search_note(broken, load_result(url, study_name))
    assert any("could not write the dashboard note" in r.getMessage() for r in caplog.records)
