"""``SearchResult``: what a finished (or inspected) search gives back, and how Algorithm 1's is built
from its stored state (:func:`build_result`; rivals: :mod:`tss_opt.search.strategy_result`;
from a stored study: :func:`tss_opt.search.stored.load_result`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial

from tss_opt.config.objectives import OBJECTIVE_NAMES
from tss_opt.config.search import SearchSettings
from tss_opt.search.algorithm import Config, Measurement, canonical
from tss_opt.search.feasibility import PairedFeasibility
from tss_opt.search.sampler import BreadthFirstSampler, StoredState
from tss_opt.search.selection import pareto_front, select

__all__ = ["LevelSummary", "SearchResult", "TrialRecord", "build_result"]


@dataclass(frozen=True)
class TrialRecord:
    """One evaluated configuration.

    Attributes:
        skip_set: The skipped layers.
        level: k = |skip_set|.
        number: The Optuna trial number of its COMPLETE trial (-1 when given up).
        accept_length, metric, cost: The three objectives (``None`` when given up).
        feasible: Both feasibility bounds hold.
        values: The measurement as the evaluator returned it (objectives and extras).
        failed: Given up after its workers crashed ``max_crash_retries + 1`` times.
        infeasible_reason: Why it is infeasible, recomputed from the stored per-prompt
            values ("" when feasible).
        early_stopped: Its evaluation stopped before the last prompt.
        bounds: Paired rule only: per quantity, ``mean_diff``, ``lower``, ``upper``,
            ``tolerance``, ``n`` (see :class:`tss_opt.search.feasibility.Bound`).
    """

    skip_set: frozenset[int]
    level: int
    number: int
    accept_length: float | None
    metric: float | None
    cost: float | None
    feasible: bool
    values: Mapping[str, Any] = field(default_factory=dict)
    failed: bool = False
    infeasible_reason: str = ""
    early_stopped: bool = False
    bounds: Mapping[str, Any] = field(default_factory=dict)

    def objectives(self) -> dict[str, float | None]:
        """The three objectives by their stored names (``None`` for a set given up)."""
        return dict(zip(OBJECTIVE_NAMES, (self.accept_length, self.metric, self.cost), strict=True))

    @classmethod
    def given_up(cls, config: Config) -> TrialRecord:
        """The record of a skip set given up after its workers crashed (no measurement)."""
        return cls(config, len(config), -1, None, None, None, False, {}, True)

    @classmethod
    def measured(
        cls,
        config: Config,
        m: Measurement,
        trial: FrozenTrial,
        *,
        feasible: bool,
        infeasible_reason: str = "",
        early_stopped: bool = False,
        bounds: Mapping[str, Any] | None = None,
    ) -> TrialRecord:
        """The record of a measured skip set: ``m``'s objectives, and as ``values`` the
        objectives with the evaluator's extras from ``trial`` (its COMPLETE trial; the
        search's own bookkeeping attributes left out)."""
        values: dict[str, Any] = m.objectives()
        values.update({k: v for k, v in trial.user_attrs.items() if k not in _BOOKKEEPING_ATTRS})
        if m.per_prompt is not None and m.per_prompt.tokens is not None:
            # The generated tokens of the prompts it ran, counted per prompt (studies chunked
            # before chunk totals were summed stored a per-chunk mean as new_tokens).
            values["new_tokens"] = int(round(sum(m.per_prompt.tokens)))
        return cls(
            skip_set=config,
            level=len(config),
            number=trial.number,
            accept_length=m.accept_length,
            metric=m.metric,
            cost=m.cost,
            feasible=feasible,
            values=values,
            infeasible_reason=infeasible_reason,
            early_stopped=early_stopped,
            bounds=bounds if bounds is not None else {},
        )


@dataclass(frozen=True)
class LevelSummary:
    """Per level: configurations evaluated, planned (``total``), and feasible."""

    level: int
    evaluated: int
    total: int
    feasible: int


@dataclass(frozen=True)
class SearchResult:
    """The outcome of :func:`~tss_opt.search.run_search`.

    Attributes:
        best: S*, the selected skip set (``frozenset()`` when nothing beats dense).
        pareto: Feasible sets not dominated on (acceptance, metric, cost), by ascending cost.
        baseline: The dense measurement (objectives and extras).
        trials: Every evaluated configuration, level by level in canonical order.
        levels: Per-level counts.
        study_name: The Optuna study.
        pool: The candidate pool (ascending layers; empty if level 1 never completed).
        selection: The rule that chose ``best``.
        stop_reason: Why the search stopped ("" while unfinished).
        finished: Whether the search has finished.
        metric_name: The task metric's name.
        num_layers: L.
        settings: The search settings (``None`` when unknown).
        metric_higher_is_better: The metric's direction.
        feasibility_rule: ``"paired"`` or ``"point"``: the rule actually applied (``point``
            when the evaluator gave no per-prompt values).
    """

    best: frozenset[int]
    pareto: list[frozenset[int]]
    baseline: Mapping[str, Any]
    trials: list[TrialRecord]
    levels: list[LevelSummary]
    study_name: str
    pool: tuple[int, ...]
    selection: str
    stop_reason: str
    finished: bool
    metric_name: str
    num_layers: int
    settings: SearchSettings | None = None
    metric_higher_is_better: bool = True
    feasibility_rule: str = "point"

    def record(self, skip_set: frozenset[int] | set[int] | tuple[int, ...]) -> TrialRecord:
        """The record of one skip set (``KeyError`` if it was not evaluated)."""
        key = frozenset(skip_set)
        for r in self.trials:
            if r.skip_set == key:
                return r
        raise KeyError(f"skip set {sorted(key)} was not evaluated in study '{self.study_name}'")

    @property
    def evaluator(self) -> str | None:
        """What produced the figures: ``"engine"`` (speculative decoding timed), ``"replay"``
        (no decoding timed: no ``tokens_per_s``), or ``None`` when the dense trial does not
        say (an older study or a user's evaluator); see :mod:`tss_opt.search.figures`."""
        kind = self.baseline.get("evaluator")
        return kind if isinstance(kind, str) and kind else None

    @property
    def best_record(self) -> TrialRecord:
        return self.record(self.best)

    @property
    def given_up(self) -> list[frozenset[int]]:
        """Configurations given up after their workers crashed ``max_crash_retries + 1``
        times; the search treated them as infeasible, so S* and the Pareto set may differ
        from a run where they were measured. Delete their FAIL trials and resume to re-run."""
        return [r.skip_set for r in self.trials if r.failed]

    @property
    def evaluated(self) -> set[frozenset[int]]:
        """The set of evaluated skip sets (baseline included)."""
        return {r.skip_set for r in self.trials}

    def summary(self) -> dict[str, Any]:
        """A JSON-ready digest (stored as the study's ``result`` user attribute)."""
        return {
            "finished": self.finished,
            "stop_reason": self.stop_reason,
            "selection": self.selection,
            "best": list(canonical(self.best)),
            "pareto": [list(canonical(c)) for c in self.pareto],
            "pool": list(self.pool),
            "evaluated": len(self.trials),
            "feasibility": self.feasibility_rule,
            "given_up": [list(canonical(c)) for c in self.given_up],
            # What produced the figures: "engine" (decoding timed), "replay", or None.
            "evaluator": self.evaluator,
        }


def build_result(
    state: StoredState,
    sampler: BreadthFirstSampler,
    *,
    study_name: str,
    selection: str,
    metric_name: str,
) -> SearchResult:
    """Turn a stored state into a :class:`SearchResult` (best, Pareto, records, levels)."""
    plan = state.plan
    hib = sampler.metric_higher_is_better
    results = state.results
    feasible = set(plan.feasible)
    records: list[TrialRecord] = []
    for config in plan.planned:
        if config not in results:
            continue
        m = results[config]
        if m is None:
            records.append(TrialRecord.given_up(config))
            continue
        trial = state.complete[config]
        verdict = plan.thresholds.verdict(m) if plan.thresholds is not None else None
        records.append(
            TrialRecord.measured(
                config,
                m,
                trial,
                feasible=config in feasible,
                infeasible_reason=""
                if config in feasible or verdict is None
                else (verdict.reason or "its level was not searched under this rule"),
                early_stopped=bool(trial.user_attrs.get("early_stopped", False)),
                bounds={k: b.to_dict() for k, b in verdict.bounds.items()} if verdict else {},
            )
        )
    baseline = next((r.values for r in records if not r.skip_set), {})
    best = select(selection, plan, results, metric_higher_is_better=hib)
    pareto = (
        pareto_front(plan.feasible, results, metric_higher_is_better=hib) if plan.baseline else []
    )
    return SearchResult(
        best=best,
        pareto=pareto,
        baseline=baseline,
        trials=records,
        levels=[
            LevelSummary(lv.level, lv.evaluated, len(lv.configs), len(lv.feasible))
            for lv in plan.levels
        ],
        study_name=study_name,
        pool=tuple(plan.pool or ()),
        selection=selection,
        stop_reason=plan.stop_reason,
        finished=plan.finished,
        metric_name=metric_name,
        num_layers=sampler.num_layers,
        settings=sampler.settings,
        metric_higher_is_better=hib,
        feasibility_rule="paired" if isinstance(plan.thresholds, PairedFeasibility) else "point",
    )


# Trial user attributes written by the search itself, not by the evaluator.
_BOOKKEEPING_ATTRS = frozenset(
    {
        "skip_set",
        "level",
        "num_skipped",
        "sparsity",
        "feasible",
        "per_prompt",
        "prompts_used",
        "early_stopped",
        "infeasible_reason",
        "paired_bounds",
    }
)
