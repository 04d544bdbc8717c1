"""Report file names built from mapping domain names stay inside ``report_dir``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tss_opt.report import add_study_plots
from tss_opt.search import run_search


class Synthetic:
    num_layers = 4
    metric_name = "f1"

    def __call__(self, skip: frozenset[int]) -> dict[str, float]:
        a = 2.0 + 0.1 * len(skip) - (0.6 if 0 in skip else 0.0)
        return {"accept_length": a, "metric": 0.5 - 0.01 * len(skip), "cost": (4 - len(skip)) / 4 / a}


@pytest.mark.parametrize(
    "name", ["../../evil", "/etc/evil", "a/b", "..", "", "x\\..\\y", "q a:b", "é"]
)
def test_safe_file_stem_never_leaves_the_directory(name: str, tmp_path: Path) -> None:
    from tss_opt.report.heldout import safe_file_stem

    stem = safe_file_stem(name)
    assert stem and "/" not in stem and "\\" not in stem and not stem.startswith(".")
    assert (tmp_path / f"profile_{stem}.png").resolve().parent == tmp_path.resolve()


def test_plain_names_are_kept_and_distinct_names_stay_distinct() -> None:
    from tss_opt.report.heldout import safe_file_stem

    assert safe_file_stem("qa") == "qa" and safe_file_stem("legal-v2.1") == "legal-v2.1"
    assert safe_file_stem("a/b") != safe_file_stem("a_b")


def test_crafted_domain_name_writes_inside_report_dir(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tss.db'}"
    run_search(Synthetic(), storage=url, study_name="s", max_depth=1, show_progress=False)
    out = tmp_path / "a" / "b" / "report"
    comp = SimpleNamespace(
        domain="../../../escaped",
        entry={"study": {"name": "s", "storage": url}, "skip_set": [1]},
        tss=SimpleNamespace(skip=frozenset({1})),
        plots={},
        plot_error=None,
    )
    add_study_plots(comp, out)
    assert comp.plot_error is None and set(comp.plots) == {"profile", "pareto"}
    for path in comp.plots.values():
        assert Path(path).resolve().parent == out.resolve()
        assert Path(path).is_file()
    written = list(tmp_path.glob("**/*.png"))
    assert len(written) == 2 and all(p.resolve().parent == out.resolve() for p in written)
