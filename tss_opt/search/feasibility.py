"""Paired, noise-aware feasibility: one-sided Student-t bounds on per-prompt differences.

A point rule (``A(S) >= A0 - eps``) on a few prompts cannot separate an effect from
noise, so cheap skip sets pass by luck and fail on unseen prompts. Here every skip set is
compared with the dense run *prompt by prompt* (the same prompts, the same order), and it is
feasible only when the data show, at the configured ``confidence``, that its mean loss stays
within the tolerance.

Method (analytic and deterministic, no resampling):

- For an objective x (accepted length or the metric) and n prompts, the paired differences
  are ``d_i = s * (x_i(S) - x_i(dense))`` with ``s = +1`` for higher-is-better and ``-1``
  otherwise, so ``d_i < 0`` is a loss.
- ``mean = mean(d)``, ``se = stdev(d) / sqrt(n)`` (sample standard deviation, n - 1), and
  ``q = t_{confidence, n-1}`` the one-sided Student-t quantile. The lower confidence bound is
  ``lower = mean - q * se`` and the upper one ``upper = mean + q * se``.
- The tolerance is ``delta = eps * |mean of dense's per-prompt values|`` (``relative=True``)
  or ``delta = eps`` (``relative=False``); the metric's relative tolerance is at least
  ``eps_metric_abs`` (:class:`tss_opt.search.tolerance.MetricTolerance`).
- **Feasible** when, for accepted length and for the metric, ``lower >= -delta``: at
  confidence ``c`` the true mean loss is within the tolerance. The constraint value written
  to Optuna is ``-delta - lower`` (<= 0: feasible; > 0: by how much the bound misses).
- **Degeneration guard**: with per-prompt ``repetition`` (share of repeated 4-grams,
  0..1), a skip set is infeasible when its repetition increase over dense is *clearly* above
  ``max_repetition_increase``: the lower bound of the mean paired increase exceeds it
  (constraint value ``lower - max_repetition_increase``).
- **Candidate pool** (OR rule): a single-layer skip enters the pool when the bound holds with
  the tau tolerance for accepted length *or* for the metric.
- **Early stop** (:meth:`PairedFeasibility.hopeless`): after part of the prompts, a set is
  already infeasible when even the *upper* bound of an objective's mean difference is below
  ``-delta`` (or the repetition lower bound is above its limit): at the same confidence the
  true mean is worse than the tolerance, so the remaining prompts would have to overturn a
  significant result. A set stopped early is never feasible. The caller
  (:class:`tss_opt.search.chunked.ChunkedRun`) runs this test at a Bonferroni-corrected
  confidence over its interim looks.
- **Futility stop** (:meth:`PairedFeasibility.futile`): after ``n`` of ``N``
  prompts, a set also stops when the *final* verdict can no longer pass, even where the true
  mean loss may be within the tolerance (too noisy for ``N`` prompts to show it). With the
  remaining prompts' mean at its upper prediction bound ``R+ = mean_n + t_{c', n-1} * s_n *
  sqrt(1/n + 1/(N - n))`` (``c'`` the look's corrected confidence), the final mean is at most
  ``M+ = (n mean_n + (N - n) R+) / N``; the final standard deviation is at least what the
  first ``n`` prompts alone give around the final mean, ``(N - 1) s_N^2 >= (n - 1) s_n^2 +
  n (mean_n - M)^2``. So the final lower bound is at most :func:`futility_bound` ``=
  max_{M <= M+} M - t_{c, N-1} sqrt(((n - 1) s_n^2 + n (mean_n - M)^2) / (N (N - 1)))``
  and the set is futile when that is below ``-delta``. It is wrong (stops a set that the full
  evaluation would accept) only when the remaining prompts beat ``R+``: probability at most
  ``1 - c'`` for one objective at one look; the caller corrects ``c'`` over the looks and the
  two objectives (Bonferroni), so at most ``1 - c`` in all (normal per-prompt differences). A futile set
  also fails the rule on the prompts it used (its partial lower bound is below the bound above),
  so replaying the stored trials gives the same pool and feasible sets.

Why Student-t: with n >= 2 prompts it needs no seed, gives the same answer on every worker
and when replayed from the storage, and is exact for normal differences; the mean of 16 or
more bounded per-prompt scores is close enough to normal for a screening rule. With identical
outputs (``stdev = 0``) the bound is the mean itself.

Nothing here imports Optuna or torch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tss_opt.config.objectives import ACCEPT_LENGTH, METRIC, PAIRED_OBJECTIVES
from tss_opt.config.search import SearchSettings
from tss_opt.search.tolerance import MetricTolerance

__all__ = [
    "FEASIBILITIES",
    "Bound",
    "PairedFeasibility",
    "PerPrompt",
    "Verdict",
    "futility_bound",
    "paired_bound",
    "t_quantile",
]

FEASIBILITIES = ("paired", "point")

# Per-prompt values are stored (and therefore compared) with this many decimals, so a worker's
# decision and a replay from the storage see the same numbers.
PER_PROMPT_DECIMALS = 4


@dataclass(frozen=True)
class PerPrompt:
    """Per-prompt values of one evaluation, in the evaluator's fixed prompt order.

    Attributes:
        accept_length: Accepted length per prompt.
        metric: Metric per prompt.
        tokens: Generated tokens per prompt (``None``: not reported).
        repetition: Share of repeated 4-grams in each output, 0..1 (``None``: not reported).
    """

    accept_length: tuple[float, ...]
    metric: tuple[float, ...]
    tokens: tuple[float, ...] | None = None
    repetition: tuple[float, ...] | None = None

    @property
    def n(self) -> int:
        """How many prompts."""
        return len(self.accept_length)

    def to_dict(self) -> dict[str, list[float]]:
        """The compact stored form: one list per quantity (absent ones left out)."""
        out = {ACCEPT_LENGTH: list(self.accept_length), METRIC: list(self.metric)}
        if self.tokens is not None:
            out["tokens"] = list(self.tokens)
        if self.repetition is not None:
            out["repetition"] = list(self.repetition)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> PerPrompt | None:
        """Rebuild from :meth:`to_dict`'s form; ``None`` for anything else."""
        if not isinstance(data, dict):
            return None
        try:
            acc = tuple(float(x) for x in data[ACCEPT_LENGTH])
            met = tuple(float(x) for x in data[METRIC])
        except (KeyError, TypeError, ValueError):
            return None
        opt = {}
        for key in ("tokens", "repetition"):
            vals = data.get(key)
            opt[key] = tuple(float(x) for x in vals) if isinstance(vals, list) else None
        return cls(acc, met, **opt)

    def prefix(self, n: int) -> PerPrompt:
        """The first ``n`` prompts."""

        def cut(v: tuple[float, ...] | None) -> tuple[float, ...] | None:
            return None if v is None else v[:n]

        return PerPrompt(self.accept_length[:n], self.metric[:n], cut(self.tokens), cut(self.repetition))

    @staticmethod
    def concat(parts: Sequence[PerPrompt]) -> PerPrompt:
        """Chunks joined in order (an optional list survives only if every chunk has it)."""

        def join(name: str) -> tuple[float, ...] | None:
            vals = [getattr(p, name) for p in parts]
            if any(v is None for v in vals):
                return None
            return tuple(x for v in vals for x in v)

        return PerPrompt(
            tuple(x for p in parts for x in p.accept_length),
            tuple(x for p in parts for x in p.metric),
            join("tokens"),
            join("repetition"),
        )


# -- Student-t quantile ---------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``0.5 < p < 1``),
    from scipy (a dependency); cached because every bound of a search asks the same few.

    E.g. ``t_quantile(0.9, 15) = 1.3406``.
    """
    if not 0.5 < p < 1.0 or df < 1:
        raise ValueError(f"t_quantile(p={p}, df={df}): expected 0.5 < p < 1 and df >= 1.")
    from scipy.stats import t  # imported here: scipy.stats costs ~0.3 s and most commands never ask

    return float(t.ppf(p, df))


@dataclass(frozen=True)
class Bound:
    """A one-sided confidence statement on the mean paired difference of one quantity.

    Attributes:
        mean: Mean of ``d_i`` (oriented: negative = worse than dense, except repetition where
            positive = more repetition).
        lower, upper: ``mean -/+ t_{c, n-1} * stdev / sqrt(n)``.
        n: Prompts used.
        tolerance: The allowed loss ``delta`` (accept/metric) or increase (repetition).
    """

    mean: float
    lower: float
    upper: float
    n: int
    tolerance: float

    def to_dict(self) -> dict[str, float]:
        return {
            "mean_diff": round(self.mean, 6),
            "lower": round(self.lower, 6),
            "upper": round(self.upper, 6),
            "tolerance": round(self.tolerance, 6),
            "n": self.n,
        }


def paired_bound(
    values: Sequence[float], reference: Sequence[float], confidence: float, *, sign: float = 1.0
) -> tuple[float, float, float]:
    """``(mean, lower, upper)`` of ``sign * (values - reference)`` at one-sided ``confidence``.

    Args:
        values: Per-prompt values of the skip set (length n >= 2).
        reference: The dense run's values for the same prompts (length >= n; the first n are
            used, so a partial evaluation compares with the same prompts).
        confidence: One-sided confidence level, in (0.5, 1).
        sign: +1 for a higher-is-better quantity, -1 for a lower-is-better one.
    """
    n = len(values)
    if n < 2:
        raise ValueError(f"a paired bound needs at least 2 prompts, got {n}")
    d = [sign * (v - r) for v, r in zip(values, reference[:n], strict=True)]
    mean = math.fsum(d) / n
    var = math.fsum((x - mean) ** 2 for x in d) / (n - 1)
    half = t_quantile(confidence, n - 1) * math.sqrt(var / n)
    return mean, mean - half, mean + half


def futility_bound(
    values: Sequence[float],
    reference: Sequence[float],
    total: int,
    confidence: float,
    look_confidence: float,
    *,
    sign: float = 1.0,
) -> float:
    """An upper bound on the paired lower bound that ``total`` prompts will give (module docstring).

    Args:
        values: The skip set's per-prompt values so far (``2 <= n <= total``).
        reference: The dense run's values for the same prompts (the first n are used).
        total: Prompts of the full evaluation (``N``).
        confidence: The rule's one-sided confidence (the final bound's ``t_{c, N-1}``).
        look_confidence: One-sided confidence of the prediction bound on the remaining
            prompts' mean (the look's corrected confidence).
        sign: +1 for a higher-is-better quantity, -1 for a lower-is-better one.

    Returns:
        ``L+``: the final lower bound exceeds it only when the remaining prompts' mean beats
        its upper prediction bound (probability ``1 - look_confidence`` for normal
        differences). With ``n == total`` it is the final lower bound itself.
    """
    n, N = len(values), int(total)
    if not 2 <= n <= N:
        raise ValueError(f"a futility bound needs 2 <= prompts so far <= total, got {n} of {N}")
    d = [sign * (v - r) for v, r in zip(values, reference[:n], strict=True)]
    mean = math.fsum(d) / n
    ss = math.fsum((x - mean) ** 2 for x in d)  # (n - 1) s_n^2
    k = t_quantile(confidence, N - 1) / math.sqrt(N * (N - 1))
    rest = N - n
    if rest == 0:
        return mean - k * math.sqrt(ss)
    r_plus = mean + t_quantile(look_confidence, n - 1) * math.sqrt(ss / (n - 1) * (1.0 / n + 1.0 / rest))
    m_plus = (n * mean + rest * r_plus) / N
    # f(M) = M - k sqrt(ss + n (M - mean)^2) is concave with its maximum at mean + u*,
    # u*^2 = ss / (k^2 n^2 - n) when k^2 n > 1 (else f rises for ever): f's largest value
    # over M <= M+ is at min(M+, mean + u*).
    top = m_plus
    if k * k * n > 1.0:
        top = min(m_plus, mean + math.sqrt(ss / (k * k * n * n - n)))
    return top - k * math.sqrt(ss + n * (top - mean) ** 2)


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


@dataclass(frozen=True)
class Verdict:
    """Feasibility of one measurement with its reason and figures.

    Attributes:
        feasible: The rule holds.
        constraints: Values written to Optuna, each <= 0 when satisfied.
        constraint_names: Their names (``accept_length``, ``metric``, maybe ``repetition``).
        reason: Why infeasible ("" when feasible).
        bounds: Per quantity, the :class:`Bound` (paired rule only).
    """

    feasible: bool
    constraints: tuple[float, ...]
    constraint_names: tuple[str, ...]
    reason: str = ""
    bounds: dict[str, Bound] = field(default_factory=dict)


@dataclass(frozen=True)
class PairedFeasibility:
    """The paired rule against one dense baseline (see the module docstring).

    Attributes:
        baseline: The dense run's per-prompt values (n >= 2).
        tol_accept: ``delta_A``, the absolute loss allowed on mean accepted length.
        tol_metric: ``delta_M``, the absolute loss allowed on the mean metric.
        confidence: One-sided confidence level.
        metric_higher_is_better: The metric's direction.
        max_repetition_increase: Allowed increase of the mean repetition share (guard);
            used only when both runs report ``repetition``.
    """

    baseline: PerPrompt
    tol_accept: float
    tol_metric: float
    confidence: float
    metric_higher_is_better: bool = True
    max_repetition_increase: float = 0.1

    @classmethod
    def build(
        cls,
        baseline: PerPrompt,
        settings: SearchSettings,
        *,
        pool: bool = False,
        metric_higher_is_better: bool = True,
    ) -> PairedFeasibility:
        """The rule of ``settings``: its eps (with ``pool``, its tau), ``relative``,
        ``confidence`` and ``max_repetition_increase``. Relative tolerances are fractions of
        dense's per-prompt means; the metric's is :class:`~tss_opt.search.tolerance.MetricTolerance`
        (with its floor)."""
        eps_accept = settings.tau_accept if pool else settings.eps_accept
        tol_a = eps_accept * abs(_mean(baseline.accept_length)) if settings.relative else eps_accept
        tol_m = MetricTolerance.of(settings, pool=pool).delta(_mean(baseline.metric))
        return cls(
            baseline, tol_a, tol_m, settings.confidence, metric_higher_is_better, settings.max_repetition_increase
        )

    @property
    def n(self) -> int:
        return self.baseline.n

    def _paired(
        self, pp: PerPrompt
    ) -> tuple[tuple[str, tuple[float, ...], tuple[float, ...], float, float], ...]:
        """Per paired objective (:data:`PAIRED_OBJECTIVES`, in that order): its name, ``pp``'s
        and dense's per-prompt values, the sign that makes a loss negative, the tolerance."""
        sign_m = 1.0 if self.metric_higher_is_better else -1.0
        return (
            (ACCEPT_LENGTH, pp.accept_length, self.baseline.accept_length, 1.0, self.tol_accept),
            (METRIC, pp.metric, self.baseline.metric, sign_m, self.tol_metric),
        )

    def bounds(self, pp: PerPrompt) -> dict[str, Bound]:
        """The paired bounds of ``pp`` (its n prompts against dense's first n)."""
        n = pp.n
        out: dict[str, Bound] = {}
        for name, vals, ref, sign, tol in self._paired(pp):
            mean, lo, hi = paired_bound(vals, ref, self.confidence, sign=sign)
            out[name] = Bound(mean, lo, hi, n, tol)
        if pp.repetition is not None and self.baseline.repetition is not None:
            mean, lo, hi = paired_bound(pp.repetition, self.baseline.repetition, self.confidence)
            out["repetition"] = Bound(mean, lo, hi, n, self.max_repetition_increase)
        return out

    def _check(self, pp: PerPrompt | None) -> PerPrompt:
        if pp is None or pp.n < 2 or pp.n > self.n:
            got = "no per_prompt" if pp is None else f"{pp.n} prompt(s)"
            raise ValueError(
                f"paired feasibility needs 2..{self.n} per-prompt values (dense has {self.n}); got {got}"
            )
        return pp

    def verdict(self, m: Any) -> Verdict:
        """Feasibility of a :class:`~tss_opt.search.algorithm.Measurement` with reason and bounds.

        A measurement over fewer prompts than dense (stopped early) is never feasible.
        """
        pp = self._check(getattr(m, "per_prompt", None))
        b = self.bounds(pp)
        names = list(PAIRED_OBJECTIVES)
        cons = [-b[k].tolerance - b[k].lower for k in PAIRED_OBJECTIVES]
        if "repetition" in b:
            names.append("repetition")
            cons.append(b["repetition"].lower - b["repetition"].tolerance)
        reasons = []
        pct = f"{self.confidence:.0%}"
        for name in PAIRED_OBJECTIVES:
            x = b[name]
            if x.lower < -x.tolerance:
                reasons.append(
                    f"{name}: {pct} lower bound of the paired difference {x.lower:+.4f} < "
                    f"-{x.tolerance:.4f} (mean {x.mean:+.4f}, n={x.n})"
                )
        if "repetition" in b and b["repetition"].lower > b["repetition"].tolerance:
            x = b["repetition"]
            reasons.append(
                f"degenerate output: repetition rises by {x.mean:+.3f} over dense ({pct} lower "
                f"bound {x.lower:+.3f} > max_repetition_increase={x.tolerance})"
            )
        if pp.n < self.n:
            reasons.insert(0, f"stopped early after {pp.n} of {self.n} prompts")
        return Verdict(not reasons, tuple(cons), tuple(names), "; ".join(reasons), b)

    def constraints(self, m: Any) -> tuple[float, ...]:
        """Constraint values (bound minus threshold, <= 0 when satisfied)."""
        return self.verdict(m).constraints

    def satisfied(self, m: Any) -> bool:
        """The strict rule: both objectives (and the guard) hold, on all prompts."""
        return self.verdict(m).feasible

    def either(self, m: Any) -> bool:
        """The permissive pool rule: accepted length or the metric holds (use tau tolerances)."""
        b = self.bounds(self._check(getattr(m, "per_prompt", None)))
        return any(b[k].lower >= -b[k].tolerance for k in PAIRED_OBJECTIVES)

    def hopeless(self, pp: PerPrompt, *, pool: PairedFeasibility | None = None) -> str:
        """Why a partial evaluation is already infeasible at this confidence ("" if not).

        Args:
            pp: The per-prompt values of the prompts evaluated so far (n >= 2).
            pool: The tau rule; given at level 1, where a set stops only when it can also not
                enter the candidate pool (so early stopping never changes the pool).
        """
        if pp.n < 2:
            return ""
        b = self.bounds(pp)
        pct = f"{self.confidence:.0%}"
        why = ""
        for name in PAIRED_OBJECTIVES:
            x = b[name]
            if x.upper < -x.tolerance:
                why = (
                    f"{name}: {pct} upper bound of the paired difference {x.upper:+.4f} < "
                    f"-{x.tolerance:.4f} after {x.n} prompts"
                )
                break
        if not why and "repetition" in b and b["repetition"].lower > b["repetition"].tolerance:
            x = b["repetition"]
            why = (
                f"degenerate output: repetition {pct} lower bound {x.lower:+.3f} > "
                f"max_repetition_increase={x.tolerance} after {x.n} prompts"
            )
        if why and pool is not None:
            pb = pool.bounds(pp)
            if any(pb[k].upper >= -pb[k].tolerance for k in PAIRED_OBJECTIVES):
                return ""  # it might still enter the candidate pool: evaluate it fully
        return why

    def futile(
        self, pp: PerPrompt, total: int, look_confidence: float, *, pool: PairedFeasibility | None = None
    ) -> str:
        """Why a partial evaluation can no longer pass this rule after ``total`` prompts ("" if
        it still can): the futility stop of the module docstring.

        An objective is dead when its :func:`futility_bound` is below ``-delta``
        (:meth:`hopeless`, tested first, covers a mean shown worse than that). The set is futile when
        one objective is dead under this rule (the AND rule of feasibility) and, with ``pool``
        (the tau rule, given at level 1), both objectives are dead under ``pool`` too (the OR
        rule of the candidate pool), so futility stopping changes neither.

        Args:
            pp: The per-prompt values of the prompts evaluated so far (n >= 2).
            total: Prompts of the full evaluation.
            look_confidence: The look's corrected confidence (``chunked``: Bonferroni).
            pool: The tau rule at level 1.
        """
        if pp.n < 2 or pp.n >= total:
            return ""
        dead = self._dead(pp, total, look_confidence)
        if not dead:
            return ""
        if pool is not None and len(pool._dead(pp, total, look_confidence)) < 2:
            return ""  # it might still enter the candidate pool: evaluate it fully
        name, bound, tol = dead[0]
        return (
            f"{name}: cannot become feasible: with the other {total - pp.n} prompts at their "
            f"{look_confidence:.1%} prediction bound, the {self.confidence:.0%} lower bound after {total} "
            f"prompts is at most {bound:+.4f} < -{tol:.4f} (after {pp.n} prompts)"
        )

    def _dead(self, pp: PerPrompt, total: int, look_confidence: float) -> list[tuple[str, float, float]]:
        """The objectives whose final lower bound cannot reach ``-delta``: (name, bound, delta)."""
        out = []
        for name, vals, ref, sign, tol in self._paired(pp):
            bound = futility_bound(vals, ref, total, self.confidence, look_confidence, sign=sign)
            if bound < -tol:
                out.append((name, bound, tol))
        return out
