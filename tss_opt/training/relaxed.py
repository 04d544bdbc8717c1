"""Per-domain settings of the lossy verification modes, chosen on calibration prompts.

- :func:`search_weight`: DIVERSED's weight ``w``, a second stage after the skip set: a small
  1-D grid on the calibration prompts under the search's metric constraint, tested with the
  paired rule of :mod:`tss_opt.search.feasibility` against the dense exact run; the feasible
  ``w`` with the highest accepted length wins (``w = 1``, exact, when none beats it).
- :func:`train_cospec_policy`: CoSpec's :class:`LogisticPolicy`, trained with REINFORCE on the
  calibration prompts; reward per prompt = the domain's task metric of the finished output minus
  ``step_cost * steps / tokens``; a batch-mean baseline.
- :func:`train_diversed_weight`: DIVERSED's context-dependent weight
  (:class:`~tss_opt.decoding.verify.blend_weight.LearnedWeight`,
  ``w = sigmoid(theta . features)``), trained the same way with a logit-normal exploration.
- :func:`check_against_dense`: any relaxed rule run once under the skip set and judged by the
  same paired rule as the weight grid (the learned rules must pass it too; see
  :mod:`tss_opt.training.relaxed_choice`, which picks a domain's setting).

Why REINFORCE for the learned weight, not a supervised fit: the quantity to optimise is the
task metric of the finished output (plus fewer steps), known only per prompt; no per-token
label says which rejected draft token was harmless. The reward is CoSpec's, so both learned
rules are trained and judged alike, and the metric constraint is enforced after training by
the paired rule against dense exact verification (a rule that fails it is not chosen).

Both take a :class:`SpecDecodeEvaluator` (its prompts, metric, drafter and protocol) and swap
its ``verifier`` while they run, restoring it afterwards.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tss_opt.config.enums import Verification
from tss_opt.config.objectives import ACCEPT_LENGTH, METRIC
from tss_opt.config.schema import RelaxedSettings
from tss_opt.decoding.verify.arbitration import FEATURES, LinearFeaturePolicy, LogisticPolicy
from tss_opt.decoding.verify.blend_weight import LearnedWeight
from tss_opt.decoding.verify.relaxed import Verifier, check_weight
from tss_opt.evaluation.evaluator import EvalResult, SpecDecodeEvaluator
from tss_opt.search.tolerance import DEFAULT_TOLERANCE, MetricTolerance

log = logging.getLogger(__name__)


@dataclass
class WeightSearch:
    """The outcome of :func:`search_weight`.

    Attributes:
        weight: the chosen ``w`` (1.0 = exact: no relaxed weight kept the metric).
        reference: the dense exact run's figures on the calibration prompts.
        rows: per tried ``w``: ``weight``, ``accept_length``, ``metric``, ``lower`` (paired
            lower bound of the metric change), ``tolerance``, ``feasible``.
    """

    weight: float
    reference: dict[str, float]
    rows: list[dict[str, Any]] = field(default_factory=list)


def _with_verifier(evaluator: SpecDecodeEvaluator, verifier: Verifier, skip: frozenset[int]) -> EvalResult:
    saved = evaluator.verifier
    evaluator.verifier = verifier
    try:
        return evaluator.evaluate(skip)
    finally:
        evaluator.verifier = saved


@dataclass
class Judged:
    """One relaxed rule on the calibration prompts under the skip set, judged against dense exact.

    Attributes:
        label: the rule (``Verifier.describe()``).
        accept_length, metric: its figures.
        metric_change: its metric minus the dense exact run's.
        lower: the paired lower bound of the (oriented) metric change.
        tolerance: the allowed drop; ``feasible``: ``lower >= -tolerance``.
        result: the evaluation behind it.
    """

    label: str
    accept_length: float
    metric: float
    metric_change: float
    lower: float
    tolerance: float
    feasible: bool
    result: EvalResult

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label, ACCEPT_LENGTH: self.accept_length, METRIC: self.metric,
            "metric_change": self.metric_change, "lower": self.lower, "tolerance": self.tolerance,
            "feasible": self.feasible,
        }


def dense_reference(evaluator: SpecDecodeEvaluator) -> EvalResult:
    """The dense exact run every relaxed rule is judged against."""
    return _with_verifier(evaluator, Verifier(Verification.exact), frozenset())


def reference_figures(ref: EvalResult) -> dict[str, float]:
    """The dense reference's figures as a tuning result stores them (accepted length, metric)."""
    return {ACCEPT_LENGTH: ref.accept_length, METRIC: ref.metric}


def check_against_dense(
    evaluator: SpecDecodeEvaluator,
    verifier: Verifier,
    skip: frozenset[int] | Sequence[int],
    reference: EvalResult,
    *,
    tolerance: MetricTolerance = DEFAULT_TOLERANCE,
    confidence: float = 0.8,
) -> Judged:
    """Run ``verifier`` under ``skip`` and apply the paired metric rule against ``reference``.

    Feasible when the one-sided paired lower bound (:func:`tss_opt.search.feasibility.paired_bound`)
    of the metric change is within ``tolerance`` of the dense metric (the search's
    :class:`~tss_opt.search.tolerance.MetricTolerance`): the search's metric constraint, as
    :func:`search_weight` applies it.
    """
    from tss_opt.search.feasibility import paired_bound

    if evaluator.num_prompts < 2:
        raise ValueError(f"the paired metric rule needs at least 2 calibration prompts, got {evaluator.num_prompts}")
    ref_scores = [p.score for p in reference.prompts]
    sign = 1.0 if evaluator.metric_higher_is_better else -1.0
    tol = tolerance.delta(sum(ref_scores) / len(ref_scores))
    r = _with_verifier(evaluator, verifier, frozenset(int(i) for i in skip))
    _, lower, _ = paired_bound([p.score for p in r.prompts], ref_scores, confidence, sign=sign)
    judged = Judged(
        label=verifier.describe(), accept_length=r.accept_length, metric=r.metric,
        metric_change=r.metric - reference.metric, lower=lower, tolerance=tol, feasible=lower >= -tol, result=r,
    )
    log.info("%s: A=%.3f M=%.4f lower=%.4f tol=%.4f %s", judged.label, r.accept_length, r.metric, lower, tol,
             "feasible" if judged.feasible else "infeasible")
    return judged


def search_weight(
    evaluator: SpecDecodeEvaluator,
    skip: frozenset[int] | Sequence[int] = frozenset(),
    settings: RelaxedSettings | None = None,
    *,
    tolerance: MetricTolerance = DEFAULT_TOLERANCE,
    confidence: float = 0.8,
    reference: EvalResult | None = None,
) -> WeightSearch:
    """Choose DIVERSED's ``w`` for one domain and skip set on the evaluator's prompts.

    Args:
        evaluator: runs the calibration prompts (at least 2).
        skip: the domain's skip set (from the first stage, the TSS search).
        settings: the grid ``weights``, each in [0, 1] (default: :class:`RelaxedSettings`').
        tolerance: the search's metric tolerance.
        confidence: one-sided confidence of the paired bound.
        reference: the dense exact run (computed when not given).

    Returns:
        :class:`WeightSearch`; a ``w`` is feasible when the paired lower bound of its metric
        change against the dense exact run is within the tolerance.
    """
    grid = [check_weight(w) for w in (settings or RelaxedSettings()).weights]
    if evaluator.num_prompts < 2:
        raise ValueError(f"search_weight needs at least 2 calibration prompts, got {evaluator.num_prompts}")
    skip = frozenset(int(i) for i in skip)
    ref = reference or dense_reference(evaluator)
    rows: list[dict[str, Any]] = []
    best_w, best_a = 1.0, float("-inf")
    for w in grid:
        j = check_against_dense(
            evaluator, Verifier(Verification.diversed, weight=w), skip, ref, tolerance=tolerance, confidence=confidence
        )
        rows.append(
            {"weight": w, ACCEPT_LENGTH: j.accept_length, METRIC: j.metric, "lower": j.lower,
             "tolerance": j.tolerance, "feasible": j.feasible}
        )
        if j.feasible and j.accept_length > best_a:
            best_w, best_a = w, j.accept_length
    return WeightSearch(
        weight=best_w, reference=reference_figures(ref), rows=rows
    )


def _reinforce(
    evaluator: SpecDecodeEvaluator,
    skip: frozenset[int],
    pol: LinearFeaturePolicy,
    verifier: Verifier,
    *,
    epochs: int,
    lr: float,
    step_cost: float,
    term: Callable[[float, tuple[torch.Tensor, float, float]], tuple[torch.Tensor, float]],
    summary: Callable[[float, int], dict[str, float]],
    rule: str,
    describe: Callable[[dict[str, float]], str],
) -> list[dict[str, float]]:
    """The REINFORCE loop both learned rules share; returns the per-epoch history.

    Each epoch runs the evaluator's prompts once with ``verifier`` (which holds ``pol``, in
    training mode: one episode of recorded decisions per prompt). The reward per prompt is its
    task metric, oriented by the metric's direction, minus ``step_cost * steps / new_tokens``;
    the advantage subtracts the epoch's mean reward. ``pol.theta`` moves by ``lr`` times the
    gradient averaged over prompts. ``pol`` leaves training mode however the loop ends.

    Args:
        term: ``(advantage, decision) -> (gradient term, statistic)`` for one recorded decision
            (the score function of the rule's distribution, times the advantage).
        summary: ``(sum of statistics, decisions) -> the epoch's extra history fields``.
        rule: names the rule in the log; ``describe`` gives the log line's tail from a history row.
    """
    sign = 1.0 if evaluator.metric_higher_is_better else -1.0
    history: list[dict[str, float]] = []
    try:
        for epoch in range(epochs):
            pol.training = True
            pol.episodes = []
            r = _with_verifier(evaluator, verifier, skip)
            if len(pol.episodes) != len(r.prompts):
                raise RuntimeError(f"{len(pol.episodes)} episodes for {len(r.prompts)} prompts: one per request expected")
            rewards = [sign * p.score - step_cost * p.steps / max(p.new_tokens, 1) for p in r.prompts]
            baseline = sum(rewards) / len(rewards)
            grad = torch.zeros(len(FEATURES), dtype=torch.float64)
            decisions, total = 0, 0.0
            for reward, episode in zip(rewards, pol.episodes, strict=True):
                for decision in episode:
                    g, stat = term(reward - baseline, decision)
                    grad += g
                    decisions += 1
                    total += stat
            pol.theta += lr * grad / len(rewards)
            row = {
                "epoch": float(epoch),
                "reward": baseline,
                METRIC: r.metric,
                ACCEPT_LENGTH: r.accept_length,
                **summary(total, decisions),
            }
            history.append(row)
            log.info("%s REINFORCE epoch %d: reward %.4f metric %.4f A %.3f %s", rule, epoch, baseline, r.metric,
                     r.accept_length, describe(row))
    finally:
        pol.training = False
        pol.episodes = []
    return history


@dataclass
class PolicyTraining:
    """The outcome of :func:`train_cospec_policy`.

    Attributes:
        policy: the trained policy (``training`` off: greedy decisions).
        history: per epoch: mean ``reward``, ``metric``, ``accept_length``, ``keep_rate``.
    """

    policy: LogisticPolicy
    history: list[dict[str, float]] = field(default_factory=list)


def train_cospec_policy(
    evaluator: SpecDecodeEvaluator,
    skip: frozenset[int] | Sequence[int] = frozenset(),
    settings: RelaxedSettings | None = None,
    *,
    policy: LogisticPolicy | None = None,
) -> PolicyTraining:
    """REINFORCE for CoSpec's arbitration policy on the evaluator's (calibration) prompts.

    One episode per prompt: the policy samples keep/reject at each step's first mismatch;
    the reward is the prompt's task metric minus ``step_cost * steps / new_tokens`` (fewer
    verification steps per token is cheaper). The gradient of the log-likelihood of a
    Bernoulli-logistic decision is ``(a - pi) * features``; the advantage subtracts the
    epoch's mean reward. Updates once per epoch (a pass over the prompts).

    Args:
        settings: ``epochs`` (passes over the prompts; keep it small: each is one
            evaluation), ``lr`` (step size on the weights of :data:`FEATURES`), ``step_cost``
            (weight of the steps-per-token cost in the reward), ``seed`` (default:
            :class:`RelaxedSettings`').
        policy: the starting policy (default: :class:`LogisticPolicy` keeping rarely).
    """
    s = settings or RelaxedSettings()
    pol = policy or LogisticPolicy(seed=s.seed)

    def term(advantage: float, decision: tuple[torch.Tensor, float, float]) -> tuple[torch.Tensor, float]:
        # d log Bernoulli(a; pi) / d theta = (a - pi) * features (pi = sigmoid(theta . features)).
        feats, action, pi = decision
        return advantage * (action - pi) * feats, action

    history = _reinforce(
        evaluator, frozenset(int(i) for i in skip), pol, Verifier(Verification.cospec, policy=pol),
        epochs=s.epochs, lr=s.lr, step_cost=s.step_cost, term=term,
        summary=lambda kept, decisions: {"keep_rate": kept / decisions if decisions else 0.0},
        rule="CoSpec", describe=lambda row: f"keep {row['keep_rate']:.2f}",
    )
    return PolicyTraining(policy=pol, history=history)


@dataclass
class WeightTraining:
    """The outcome of :func:`train_diversed_weight`.

    Attributes:
        policy: the trained weight (``training`` off: deterministic ``sigmoid(theta . features)``).
        history: per epoch: mean ``reward``, ``metric``, ``accept_length``, ``mean_weight`` (the
            mean sampled ``w`` over the epoch's decisions), ``decisions``.
    """

    policy: LearnedWeight
    history: list[dict[str, float]] = field(default_factory=list)


def train_diversed_weight(
    evaluator: SpecDecodeEvaluator,
    skip: frozenset[int] | Sequence[int] = frozenset(),
    settings: RelaxedSettings | None = None,
    *,
    policy: LearnedWeight | None = None,
) -> WeightTraining:
    """REINFORCE for DIVERSED's context-dependent weight on the evaluator's (calibration) prompts.

    One episode per prompt: at each draft token that exact verification rejects, the policy
    draws ``z ~ N(theta . features, sigma^2)`` and blends with ``w = sigmoid(z)``. The reward is
    CoSpec's (:func:`train_cospec_policy`): the prompt's task metric (oriented by its direction)
    minus ``step_cost * steps / new_tokens``; the advantage subtracts the epoch's mean reward.
    The gradient of ``log N(z; mu, sigma)`` is ``(z - mu) / sigma^2 * features``; one update per
    epoch (a pass over the prompts), averaged over prompts.

    The result is not yet judged: check it with :func:`check_against_dense` (the tuning command
    does, and falls back to exact when it does not keep the metric).

    Args:
        settings: ``epochs`` (passes over the prompts; each is one evaluation), ``lr`` (step
            size on the weights of :data:`FEATURES`), ``step_cost`` (weight of the
            steps-per-token cost in the reward), ``sigma`` (exploration noise in logits),
            ``init_weight`` (the starting ``w``, bias only, when ``policy`` is not given),
            ``seed`` (default: :class:`RelaxedSettings`').
        policy: the starting policy.
    """
    s = settings or RelaxedSettings()
    if s.epochs < 1:
        raise ValueError(f"relaxed.epochs={s.epochs}; train for at least 1 epoch")
    pol = policy or LearnedWeight(init_weight=s.init_weight, sigma=s.sigma, seed=s.seed)

    def term(advantage: float, decision: tuple[torch.Tensor, float, float]) -> tuple[torch.Tensor, float]:
        # d log N(z; mu, sigma) / d theta = (z - mu) / sigma^2 * features; the statistic is the
        # sampled w = sigmoid(z).
        feats, z, mu = decision
        return advantage * (z - mu) / pol.sigma**2 * feats, float(torch.sigmoid(torch.tensor(z)))

    history = _reinforce(
        evaluator, frozenset(int(i) for i in skip), pol, Verifier(Verification.diversed, weight_policy=pol),
        epochs=s.epochs, lr=s.lr, step_cost=s.step_cost, term=term,
        summary=lambda w_sum, decisions: {
            "mean_weight": w_sum / decisions if decisions else float("nan"),
            "decisions": float(decisions),
        },
        rule="DIVERSED weight",
        describe=lambda row: f"mean w {row['mean_weight']:.2f} ({int(row['decisions'])} decisions)",
    )
    return WeightTraining(policy=pol, history=history)
