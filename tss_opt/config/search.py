"""Search settings: the knobs of Algorithm 1 with the paper's defaults, validated.

Paper names (TSS, Algorithm 1 and appendix Table 3) next to ours:

=================  ===================  ==========================================
ours               paper                default (source)
=================  ===================  ==========================================
eps_accept         eps_A                0.05 relative (paper: 5 %)
eps_metric         eps_M                0.05 relative (paper: 5 %)
eps_metric_abs     -                    0.005: floor of a relative eps_M
tau_accept         tau_A                0.05 relative (paper: 5 %)
tau_metric         tau_M                0.05 relative (paper: 5 %)
max_depth          K                    5 (largest reported skip set, MMLU)
mode               full enumeration     "exhaustive" (Algorithm 1); the authors'
                   / beam               scripts use "beam"
beam_width         beam width           3 (Table 3)
early_barrier      early barrier        0 (Table 3 uses 2)
latter_barrier     latter barrier       0 (Table 3)
selection          S* rule              "min_cost" (Algorithm 1); Table 3 uses
                                        "triple_win"
feasibility        (point thresholds)   "paired"; "point" = the paper
confidence         -                    0.9 (one-sided, paired rule)
seed               -                    0 (random, tpe, nsga2, gp strategies)
sleb_score         SLEB's score         "metric" (sleb strategy; paper: perplexity)
=================  ===================  ==========================================

``mode`` also names the rival strategies of :mod:`tss_opt.search.strategies` (``sleb``,
``gm_skip``, ``random``, ``accept_only``, ``metric_only``, ``tpe``, ``nsga2``, ``gp``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from tss_opt.config.enums import StrEnum
from tss_opt.config.objectives import ACCEPT_LENGTH, METRIC
from tss_opt.errors import TSSError


class SearchSettingsError(TSSError):
    """A search setting out of range or of the wrong type."""


class SettingTypeError(TypeError, SearchSettingsError):
    """A setting has the wrong type (a user error too, so commands report it in one line)."""


__all__ = [
    "DEFAULT_EPS_METRIC_ABS",
    "DEFAULT_GRACE_PERIOD",
    "DEFAULT_HEARTBEAT_INTERVAL",
    "FEASIBILITIES",
    "IDENTITY_FIELDS",
    "LEGACY_IDENTITY",
    "MODES",
    "SLEB_SCORES",
    "SELECTIONS",
    "Feasibility",
    "Mode",
    "ModeSpec",
    "SearchSettings",
    "SearchSettingsError",
    "Selection",
    "SettingTypeError",
]

# Heartbeats of running trials (seconds): a trial whose worker went silent for the grace
# period counts as crashed and is retried once (tss_opt.storage.heartbeat).
DEFAULT_HEARTBEAT_INTERVAL = 10
DEFAULT_GRACE_PERIOD = 30

# The absolute floor of a positive relative metric tolerance: half a point of a metric
# on [0, 1]; it binds where eps_metric * |native| < 0.005 (native below 0.1 at eps_metric=0.05).
# The rule and why: tss_opt.search.tolerance.metric_tolerance.
DEFAULT_EPS_METRIC_ABS = 0.005


@dataclass(frozen=True)
class ModeSpec:
    """What one search mode is: every way the modes differ, declared once on the mode's
    :class:`Mode` member and read by the settings (the study identity), the pure planners
    and the strategy registry (:mod:`tss_opt.search.registry`, which turns ``plan`` and
    ``sampler`` into functions). No code compares mode names.

    Attributes:
        plan: The planner kind that replays the mode over the stored results, run by the
            shared queue and workers: ``"breadth_first"`` (Algorithm 1), ``"greedy"``,
            ``"random"`` or ``"one_objective"``; ``""`` for an Optuna-sampler mode.
        sampler: The Optuna sampler class (``optuna.samplers.<sampler>``) of an
            Optuna-driven mode, run in one process; ``""`` for a queued mode.
        every_subset: Algorithm 1's level k is every k-subset of the pool (``exhaustive``);
            otherwise the ``beam_width`` best parents are extended by one pool layer.
        objective: ``"both"``, or the one objective (``"accept"`` / ``"metric"``) that drives
            a one-objective mode's pool, search-time feasibility and beam ranking.
        stops_on_metric: A greedy mode that stops at the first step whose best candidate
            breaks the metric bound (GM-Skip's tolerance stop).
        ranks_by_score: A greedy mode that ranks removals by ``sleb_score`` (SLEB); the
            setting then joins the study identity.
        seeded: Draws random numbers: ``seed`` joins the study identity.
        needs_budget: Refused without ``max_trials`` (it would never stop).
        first_level_one: Its first level is the baseline and one skip set (random draws,
            Optuna proposals) rather than every single-layer skip.
    """

    plan: str = ""
    sampler: str = ""
    every_subset: bool = False
    objective: str = "both"
    stops_on_metric: bool = False
    ranks_by_score: bool = False
    seeded: bool = False
    needs_budget: bool = False
    first_level_one: bool = False

    def __post_init__(self) -> None:
        # Exactly one of the two ways to run, so the registry never guesses.
        if bool(self.plan) == bool(self.sampler):
            raise ValueError(f"a mode has a planner or an Optuna sampler, not both or neither: {self}")

    @property
    def breadth_first(self) -> bool:
        """Algorithm 1 itself: its result keeps the plan's own feasibility and levels (the
        rivals' results judge every evaluated set by one rule)."""
        return self.plan == "breadth_first"

    @property
    def queued(self) -> bool:
        """Run by the shared queue and workers (several workers may join)."""
        return bool(self.plan)


# The rival strategies drawn at random: a budget, a first level of one set, a seed.
_DRAWN = {"needs_budget": True, "first_level_one": True, "seeded": True}


class Mode(StrEnum):
    """The search strategy: Algorithm 1's breadth-first search (``exhaustive``: every k-subset
    of the pool; ``beam``: the best parents extended) or a rival on the same study space
    (:mod:`tss_opt.search.strategies`). Each member carries its :class:`ModeSpec`
    (``Mode.beam.spec``): the one registry of what differs between modes. The values are
    the ``mode`` setting's names (Hydra validates them at compose time)."""

    spec: ModeSpec

    def __new__(cls, value: str, spec: ModeSpec) -> Mode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.spec = spec
        return member

    exhaustive = "exhaustive", ModeSpec(plan="breadth_first", every_subset=True)
    beam = "beam", ModeSpec(plan="breadth_first")
    sleb = "sleb", ModeSpec(plan="greedy", ranks_by_score=True)
    gm_skip = "gm_skip", ModeSpec(plan="greedy", stops_on_metric=True)
    random = "random", ModeSpec(plan="random", **_DRAWN)
    accept_only = "accept_only", ModeSpec(plan="one_objective", objective="accept")
    metric_only = "metric_only", ModeSpec(plan="one_objective", objective="metric")
    tpe = "tpe", ModeSpec(sampler="TPESampler", **_DRAWN)
    nsga2 = "nsga2", ModeSpec(sampler="NSGAIISampler", **_DRAWN)
    gp = "gp", ModeSpec(sampler="GPSampler", **_DRAWN)


class Selection(StrEnum):
    """The rule that picks S* among the evaluated configurations."""

    min_cost = "min_cost"
    triple_win = "triple_win"


class Feasibility(StrEnum):
    """How feasibility is decided (see :mod:`tss_opt.search.feasibility`)."""

    paired = "paired"
    point = "point"


MODES = tuple(m.value for m in Mode)
SLEB_SCORES = (METRIC, ACCEPT_LENGTH)
SELECTIONS = tuple(m.value for m in Selection)
FEASIBILITIES = tuple(m.value for m in Feasibility)

# Settings that decide which configurations are evaluated. A stored study is resumed only
# with the same values; `selection` is not among them because it only reads the stored
# trials (switching it re-selects without re-evaluating anything).
IDENTITY_FIELDS = (
    "mode",
    "beam_width",
    "max_depth",
    "eps_accept",
    "eps_metric",
    "tau_accept",
    "tau_metric",
    "relative",
    "early_barrier",
    "latter_barrier",
    "max_trials",
    "feasibility",
    "confidence",
    "max_repetition_increase",
    "early_stopping",
    "early_stop_chunk",
    "eps_metric_abs",
)

# What a study stored before a field existed was run under: a study created before paired
# feasibility used the point rule without early stopping, so resuming it under the paired rule
# is refused. A study created before the metric-tolerance floor had none.
LEGACY_IDENTITY: dict[str, Any] = {
    "feasibility": "point",
    "early_stopping": False,
    "futility_stopping": False,
    "eps_metric_abs": 0.0,
}


@dataclass
class SearchSettings:
    """Settings of one search (OmegaConf/Hydra structured-config compatible).

    Attributes:
        mode: ``"exhaustive"`` evaluates every k-subset of the candidate pool at level k;
            ``"beam"`` extends the ``beam_width`` best feasible sets of level k-1 by one
            pool layer.
        beam_width: Parents kept per level in beam mode (paper appendix: 3).
        max_depth: K, the largest skip-set size searched.
        eps_accept: eps_A, feasibility tolerance on acceptance (relative or absolute).
        eps_metric: eps_M, feasibility tolerance on the task metric.
        eps_metric_abs: The absolute floor of a positive relative metric tolerance (and of
            ``tau_metric``'s): ``delta_M = max(eps_metric * |M0|, eps_metric_abs)``, so a
            domain where dense scores ~0 is not held to a zero tolerance
            (:func:`tss_opt.search.tolerance.metric_tolerance`, the one rule that search,
            validation and the held-out report apply). In the metric's units: 0.005 is half a
            point of a [0, 1] metric (every built-in one); 0 disables it. Ignored when
            ``relative=False``.
        tau_accept: tau_A, candidate-pool tolerance on acceptance of single-layer skips.
        tau_metric: tau_M, candidate-pool tolerance on the metric of single-layer skips.
        relative: Tolerances are fractions of the dense baseline (``A0 * (1 - eps)``);
            ``False``: absolute differences (``A0 - eps``).
        early_barrier: The first ``early_barrier`` layers are never skipped.
        latter_barrier: The last ``latter_barrier`` layers are never skipped.
        selection: ``"min_cost"`` (Algorithm 1: the feasible set of least cost) or
            ``"triple_win"`` (appendix: metric, acceptance and tokens/s all >= dense).
        max_trials: Cap on evaluated configurations, the dense baseline included
            (``None``: no cap). Retries of crashed trials do not count.
        seed: Seed of the randomised strategies (``random``, ``tpe``, ``nsga2``, ``gp``); an
            integer. Ignored (and not part of the study identity) for the others.
        sleb_score: The quality score the ``sleb`` strategy ranks removals by:
            ``"metric"`` (the task metric on the calibration prompts) or
            ``"accept_length"``. Ignored by the other modes.
        heartbeat_interval: Seconds between heartbeats of a running trial.
        grace_period: Seconds without heartbeat after which a trial counts as crashed
            and is retried once.
        feasibility: ``"paired"`` (default): a set is feasible when a one-sided Student-t
            lower bound on its mean per-prompt difference to dense stays within the
            tolerance, for accepted length and for the metric (see
            :mod:`tss_opt.search.feasibility`); needs an evaluator returning ``per_prompt``
            (otherwise the point rule is used, with a log line). ``"point"``: the paper's rule
            on the aggregates.
        confidence: One-sided confidence level of the paired rule, in (0.5, 1).
        max_repetition_increase: Degeneration guard of the paired rule: a set whose mean
            per-prompt ``repetition`` (share of repeated 4-grams, 0..1) exceeds dense's by
            more than this (lower confidence bound) is infeasible.
        early_stopping: With the paired rule and an evaluator exposing ``num_prompts`` and
            accepting ``prompt_ids=``, trials run in chunks and stop as soon as they are
            already infeasible at ``confidence``.
        early_stop_chunk: Prompts per chunk (>= 2; the first check needs two prompts).
        futility_stopping: With early stopping, a chunked trial also stops when its final
            verdict can no longer pass at ``confidence`` (looks corrected), even if its mean
            loss may be within the tolerance (docs/search.md, "Futility stopping").
        group_size: Queued trials a worker claims and evaluates in one batch: a
            positive integer (1 = one at a time) or ``"auto"`` (by device:
            :data:`tss_opt.search.grouping.AUTO_GROUP_SIZE`). Only evaluators that generate
            several skip sets together (replay) group; not part of the study identity (the
            figures do not depend on it).
    """

    mode: Mode = Mode.exhaustive
    beam_width: int = 3
    max_depth: int = 5
    eps_accept: float = 0.05
    eps_metric: float = 0.05
    eps_metric_abs: float = DEFAULT_EPS_METRIC_ABS
    tau_accept: float = 0.05
    tau_metric: float = 0.05
    relative: bool = True
    early_barrier: int = 0
    latter_barrier: int = 0
    selection: Selection = Selection.min_cost
    max_trials: int | None = None
    seed: int = 0
    sleb_score: str = "metric"
    heartbeat_interval: int = DEFAULT_HEARTBEAT_INTERVAL
    grace_period: int = DEFAULT_GRACE_PERIOD
    feasibility: Feasibility = Feasibility.paired
    confidence: float = 0.9
    max_repetition_increase: float = 0.1
    early_stopping: bool = True
    early_stop_chunk: int = 4
    futility_stopping: bool = True
    group_size: Any = "auto"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, num_layers: int | None = None) -> None:
        """Check every field; with ``num_layers``, also that the barriers leave a layer.

        Raises:
            ValueError: A field is out of range or unknown; the message names the value,
                what was expected and how to fix it.
        """
        self.mode = Mode.parse("mode", self.mode)
        self.selection = Selection.parse("selection", self.selection)
        _choice("sleb_score", self.sleb_score, SLEB_SCORES)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise SettingTypeError(
                f"seed={self.seed!r} has type {type(self.seed).__name__}; expected an integer "
                "(e.g. seed=0)."
            )
        _int("beam_width", self.beam_width, minimum=1)
        _int("max_depth", self.max_depth, minimum=1)
        _int("early_barrier", self.early_barrier, minimum=0)
        _int("latter_barrier", self.latter_barrier, minimum=0)
        if self.max_trials is not None:
            _int("max_trials", self.max_trials, minimum=1, hint="or None for no cap")
        if not isinstance(self.relative, bool):
            raise SearchSettingsError(f"relative={self.relative!r} must be True or False.")
        for name in ("eps_accept", "eps_metric", "tau_accept", "tau_metric"):
            _tolerance(name, getattr(self, name), self.relative)
        f = self.eps_metric_abs
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or not 0 <= f < 1:
            raise SearchSettingsError(
                f"eps_metric_abs={f!r} is out of range; expected 0 <= eps_metric_abs < 1 (an absolute "
                "floor of the metric tolerance in the metric's units, e.g. 0.005; 0 disables it)."
            )
        self.feasibility = Feasibility.parse("feasibility", self.feasibility)
        _confidence(self.confidence)
        r = self.max_repetition_increase
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r < 1:
            raise SearchSettingsError(
                f"max_repetition_increase={r!r} is out of range; expected 0 <= "
                "max_repetition_increase < 1 (an increase of the repeated-4-gram share, e.g. 0.1)."
            )
        if not isinstance(self.early_stopping, bool):
            raise SearchSettingsError(f"early_stopping={self.early_stopping!r} must be True or False.")
        _int("early_stop_chunk", self.early_stop_chunk, minimum=2)
        if not isinstance(self.futility_stopping, bool):
            raise SearchSettingsError(f"futility_stopping={self.futility_stopping!r} must be True or False.")
        self.group_size = parse_group_size(self.group_size)
        _int("heartbeat_interval", self.heartbeat_interval, minimum=1)
        _int("grace_period", self.grace_period, minimum=1)
        if self.grace_period <= self.heartbeat_interval:
            raise SearchSettingsError(
                f"grace_period={self.grace_period} must exceed heartbeat_interval="
                f"{self.heartbeat_interval}, or live trials would be failed as crashed; "
                f"use e.g. grace_period={3 * self.heartbeat_interval}."
            )
        if num_layers is not None:
            _int("num_layers", num_layers, minimum=1)
            if self.early_barrier + self.latter_barrier > num_layers - 1:
                raise SearchSettingsError(
                    f"early_barrier={self.early_barrier} and latter_barrier="
                    f"{self.latter_barrier} leave no layer of {num_layers} to skip; expected "
                    f"early_barrier + latter_barrier <= {num_layers - 1}."
                )

    @property
    def mode_spec(self) -> ModeSpec:
        """What ``mode`` is (:class:`ModeSpec`); ``mode`` may still be a plain string when a
        caller assigned it after construction, so it is parsed here."""
        return Mode.parse("mode", self.mode).spec

    def allowed_layers(self, num_layers: int) -> tuple[int, ...]:
        """Layers the barriers allow to skip: ``early_barrier .. L-1-latter_barrier``."""
        self.validate(num_layers)
        return tuple(range(self.early_barrier, num_layers - self.latter_barrier))

    def identity(self) -> dict[str, Any]:
        """The settings that decide which configurations are evaluated (stored per study).

        ``seed`` counts only for the randomised modes, ``sleb_score`` only for ``sleb``,
        ``futility_stopping`` only when on and ``eps_metric_abs`` only when above 0, so the
        identity (and the study-name hash) of a search without them is what it was before
        they existed.
        """
        out = {name: _plain(getattr(self, name)) for name in IDENTITY_FIELDS if name != "eps_metric_abs"}
        if self.eps_metric_abs > 0:
            # The floor changes which sets are feasible where dense scores ~0.
            out["eps_metric_abs"] = float(self.eps_metric_abs)
        spec = self.mode_spec
        if spec.seeded:
            out["seed"] = self.seed
        if spec.ranks_by_score:
            out["sleb_score"] = self.sleb_score
        if self.futility_stopping:
            # On, it changes which trials stop; off, the identity (and the study
            # name) is what it was before the setting existed, so those studies resume.
            out["futility_stopping"] = True
        return out

    def to_dict(self) -> dict[str, Any]:
        """All fields as a plain dict (Enum members as their string values)."""
        return {k: _plain(v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> SearchSettings:
        """Build from a mapping, refusing unknown keys (a misspelt key fails loudly)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise SearchSettingsError(
                f"Unknown search setting(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}."
            )
        return cls(**dict(values))


def parse_group_size(value: Any) -> int | str:
    """``"auto"`` or a positive integer (``"4"`` from a command line becomes ``4``).

    Raises:
        SearchSettingsError: anything else, naming the value and the fix.
    """
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SearchSettingsError(
            f"group_size={value!r} is invalid; expected a positive integer (1 = one trial at a time) or "
            "'auto' (the device's default), e.g. search.group_size=4"
        )
    return value


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def _choice(name: str, value: Any, options: tuple[str, ...]) -> None:
    if value not in options:
        raise SearchSettingsError(f"Unknown {name} {value!r}; expected one of: {', '.join(options)}.")


def _int(name: str, value: Any, *, minimum: int, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        extra = f" ({hint})" if hint else ""
        raise SearchSettingsError(f"{name}={value!r} is invalid; expected an integer >= {minimum}{extra}.")


def _confidence(value: Any) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and 0.5 < value < 1
    if not ok:
        raise SearchSettingsError(
            f"confidence={value!r} is out of range; expected 0.5 < confidence < 1 (a one-sided "
            "confidence level such as 0.9 or 0.95)."
        )


def _tolerance(name: str, value: Any, relative: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SearchSettingsError(f"{name}={value!r} is not a finite number.")
    # A negative relative tolerance requires a gain (the paper's "+5 %" column of Table 4:
    # eps = -0.05 bounds A >= A0 * 1.05); it stays above -1 so the bound stays finite.
    if relative and not -1 < value < 1:
        raise SearchSettingsError(
            f"{name}={value} is out of range; expected 0 <= {name} < 1 when relative=True "
            "(a fraction of the dense baseline, e.g. 0.05 for 5 %), or -1 < "
            f"{name} < 0 to require a gain (e.g. -0.05 for 5 % better than dense)."
        )
    if not relative and value < 0:
        raise SearchSettingsError(
            f"{name}={value} is out of range; expected {name} >= 0 when relative=False "
            "(an absolute drop allowed below the dense baseline)."
        )
