"""Choosing a domain's lossy verification setting on its calibration prompts.

:func:`tune_relaxed` is the second stage after the skip set, for one mode:

- ``diversed``: the grid of fixed weights (as :func:`~tss_opt.training.relaxed.search_weight`)
  and the learned, context-dependent weight (:func:`~tss_opt.training.relaxed.train_diversed_weight`,
  warm-started at the best feasible fixed weight below 1, else at ``init_weight``);
- ``cospec``: the fixed threshold rule (the baseline) and the learned arbitration policy
  (:func:`~tss_opt.training.relaxed.train_cospec_policy`).

Every candidate, and exact verification under the same skip set, runs the calibration prompts
under the skip set and is judged by the paired metric rule against the dense exact run
(:func:`~tss_opt.training.relaxed.check_against_dense`). The chosen setting is the feasible
candidate with the highest accepted length; exact wins ties and is the fallback when no relaxed
candidate keeps the metric (then nothing lossy is chosen).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tss_opt.config.enums import Verification
from tss_opt.config.objectives import ACCEPT_LENGTH, METRIC
from tss_opt.config.schema import RelaxedSettings
from tss_opt.decoding.verify.arbitration import LogisticPolicy, ThresholdPolicy
from tss_opt.decoding.verify.relaxed import (
    RelaxedVerificationError,
    Verifier,
    check_weight,
    settings_label,
)
from tss_opt.evaluation.evaluator import EvalResult, SpecDecodeEvaluator
from tss_opt.search.tolerance import DEFAULT_TOLERANCE, MetricTolerance
from tss_opt.training.relaxed import (
    Judged,
    check_against_dense,
    dense_reference,
    reference_figures,
    train_cospec_policy,
    train_diversed_weight,
)

log = logging.getLogger(__name__)

EXACT = "exact"


@dataclass
class Candidate:
    """One setting tried: its name, the verifier settings that rebuild it, and its judgement.

    Attributes:
        name: ``exact``, ``fixed w=0.60``, ``learned weight``, ``threshold``, ``learned policy``.
        mode: ``exact``, ``diversed`` or ``cospec``.
        settings: the ``relaxed`` settings that rebuild the rule (``weight``, ``weight_policy``,
            ``policy``, ``tau_draft``/``tau_target``); paths of learned ones once saved.
        judged: its calibration figures and the paired verdict.
    """

    name: str
    mode: str
    settings: dict[str, Any]
    judged: Judged
    learned: bool = False

    @property
    def label(self) -> str:
        """The rule's label; a learned rule not yet saved is ``diversed(w=learned)`` / ``cospec(learned)``."""
        if self.learned and not (self.settings.get("weight_policy") or self.settings.get("policy")):
            return self.judged.label
        return settings_label(self.mode, self.settings)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "verification": self.label, **self.judged.to_dict()}


@dataclass
class RelaxedChoice:
    """The outcome of :func:`tune_relaxed` for one domain and mode.

    Attributes:
        mode: ``diversed`` or ``cospec``.
        skip: the skip set tuned under.
        reference: the dense exact run's ``accept_length`` and ``metric``.
        candidates: every setting tried, ``exact`` (under the skip set) first.
        chosen: the chosen candidate (``exact`` when no relaxed one kept the metric).
        history: per learned rule, its REINFORCE history.
        learned: per learned rule's name, the object (save it with :meth:`save_learned`).
        rule: the paired metric rule: the tolerance (:meth:`MetricTolerance.to_dict`, the
            configuration's names) and ``confidence``.
        num_prompts, max_new_tokens: the calibration protocol.
    """

    mode: str
    skip: frozenset[int]
    reference: dict[str, float]
    candidates: list[Candidate]
    chosen: Candidate
    history: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    learned: dict[str, Any] = field(default_factory=dict)
    rule: dict[str, Any] = field(default_factory=dict)
    num_prompts: int = 0
    max_new_tokens: int = 0

    @property
    def lossy(self) -> bool:
        """False when the choice fell back to exact verification."""
        return Verification.lossy_label(self.chosen.mode)

    def save_learned(self, directory: str | Path, stem: str) -> dict[str, Path]:
        """Write each learned rule's parameters as ``<directory>/<stem>.<kind>.json`` and point
        its candidate's settings at the file; returns the paths by candidate name."""
        out: dict[str, Path] = {}
        for cand in self.candidates:
            obj = self.learned.get(cand.name)
            if obj is None:
                continue
            kind = "diversed_weight" if cand.mode == "diversed" else "cospec_policy"
            path = obj.save(Path(directory) / f"{stem}.{kind}.json")
            cand.settings["weight_policy" if kind == "diversed_weight" else "policy"] = str(path)
            out[cand.name] = path
        return out

    def mapping_block(self) -> dict[str, Any] | None:
        """The ``relaxed`` block of a mapping entry (``None`` when exact was chosen): the settings
        that rebuild the rule plus the calibration figures behind the choice."""
        if not self.lossy:
            return None
        j = self.chosen.judged
        return {
            "mode": self.chosen.mode,
            **self.chosen.settings,
            "chosen": self.chosen.name,
            "skip_set": sorted(self.skip),
            "calibration": {
                "prompts": self.num_prompts,
                "max_new_tokens": self.max_new_tokens,
                "dense": dict(self.reference),
                ACCEPT_LENGTH: j.accept_length,
                METRIC: j.metric,
                "metric_change": j.metric_change,
                "lower": j.lower,
                "tolerance": j.tolerance,
                **self.rule,
            },
            "candidates": [c.to_dict() for c in self.candidates],
        }

    def table(self, metric_name: str = "metric") -> str:
        """A Markdown table: one row per candidate, the chosen one marked."""
        lines = [
            f"| candidate | verification | accepted length | {metric_name} | Δ {metric_name} vs dense exact | "
            "paired lower bound | tolerance | feasible | chosen |",
            "|---|---|---:|---:|---:|---:|---:|:-:|:-:|",
        ]
        for c in self.candidates:
            j = c.judged
            lines.append(
                f"| {c.name} | {c.label} | {j.accept_length:.3f} | {j.metric:.4f} | {j.metric_change:+.4f} | "
                f"{j.lower:+.4f} | {j.tolerance:.4f} | {'yes' if j.feasible else 'no'} | {'**yes**' if c is self.chosen else ''} |"
            )
        return "\n".join(lines)


def _choose(candidates: list[Candidate]) -> Candidate:
    """The feasible candidate with the highest accepted length; exact (first) wins ties and
    is the fallback when nothing is feasible."""
    exact = candidates[0]
    best = exact if exact.judged.feasible else None
    for c in candidates[1:]:
        if c.judged.feasible and (best is None or c.judged.accept_length > best.judged.accept_length):
            best = c
    return best or exact


def tune_relaxed(
    evaluator: SpecDecodeEvaluator,
    mode: Verification | str,
    skip: frozenset[int] | Sequence[int] = frozenset(),
    settings: RelaxedSettings | None = None,
    *,
    tolerance: MetricTolerance = DEFAULT_TOLERANCE,
    confidence: float = 0.8,
    learn: bool = True,
    reference: EvalResult | None = None,
) -> RelaxedChoice:
    """Choose ``mode``'s setting for one domain and skip set on the evaluator's (calibration) prompts.

    Args:
        evaluator: runs the calibration prompts (at least 2); its verifier is restored.
        mode: ``diversed`` or ``cospec``.
        skip: the domain's skip set.
        settings: the ``relaxed`` settings (default: :class:`RelaxedSettings`'): ``weights``,
            DIVERSED's fixed weights, each in [0, 1] (1.0 = exact; skipped, exact is always a
            candidate); ``tau_draft``, ``tau_target``, CoSpec's threshold baseline; ``epochs``,
            ``lr``, ``step_cost``, ``sigma``, ``init_weight``, ``seed``, the REINFORCE
            settings (:func:`train_diversed_weight`, :func:`train_cospec_policy`).
        tolerance, confidence: the paired metric rule (the search's metric tolerance and
            ``confidence``).
        learn: also train and judge the learned rule.
        reference: the dense exact run on the same prompts (computed when not given; pass it
            to tune both modes against one reference).

    Raises:
        RelaxedVerificationError: ``mode`` is exact or a weight outside [0, 1].
    """
    mode = Verification.parse("verification", mode)
    if not mode.lossy:
        raise RelaxedVerificationError(
            "tuning needs a lossy mode: verification=diversed or verification=cospec (exact has nothing to tune)"
        )
    rs = settings or RelaxedSettings()
    grid = [check_weight(w) for w in rs.weights]
    skip = frozenset(int(i) for i in skip)
    rule = {**tolerance.to_dict(), "confidence": confidence}
    ref = reference
    if ref is None:
        ref = dense_reference(evaluator)
        log.info("dense exact reference: A=%.3f M=%.4f", ref.accept_length, ref.metric)

    def judge(name: str, m: str, settings: dict[str, Any], verifier: Verifier, learned: bool = False) -> Candidate:
        log.info("candidate %s under skip %s", name, sorted(skip))
        j = check_against_dense(evaluator, verifier, skip, ref, tolerance=tolerance, confidence=confidence)
        return Candidate(name, m, settings, j, learned)

    cands = [judge(EXACT, EXACT, {}, Verifier(Verification.exact))]
    history: dict[str, list[dict[str, float]]] = {}
    learned: dict[str, Any] = {}
    if mode is Verification.diversed:
        for w in grid:
            if w >= 1.0:
                continue
            cands.append(judge(f"fixed w={w:.2f}", "diversed", {"weight": w}, Verifier(mode, weight=w)))
        if learn:
            fixed = [c for c in cands[1:] if c.judged.feasible]
            start = max(fixed, key=lambda c: c.judged.accept_length).settings["weight"] if fixed else rs.init_weight
            # Keep the start inside the sigmoid's working range: from w = 0 (logit -14) the
            # exploration noise would never reach another weight.
            start = min(max(start, 0.05), 0.95)
            log.info("training the DIVERSED weight (REINFORCE, %d epochs, start w=%.2f)", rs.epochs, start)
            trained = train_diversed_weight(evaluator, skip, replace(rs, init_weight=start))
            history["learned weight"] = trained.history
            learned["learned weight"] = trained.policy
            cands.append(judge("learned weight", "diversed", {}, Verifier(mode, weight_policy=trained.policy), True))
    else:
        taus = {"tau_draft": float(rs.tau_draft), "tau_target": float(rs.tau_target)}
        cands.append(judge("threshold", "cospec", taus, Verifier(mode, policy=ThresholdPolicy(**taus))))
        if learn:
            log.info("training the CoSpec policy (REINFORCE, %d epochs)", rs.epochs)
            trained_p = train_cospec_policy(evaluator, skip, rs, policy=LogisticPolicy(seed=rs.seed))
            history["learned policy"] = trained_p.history
            learned["learned policy"] = trained_p.policy
            cands.append(judge("learned policy", "cospec", {}, Verifier(mode, policy=trained_p.policy), True))
    chosen = _choose(cands)
    log.info("chosen: %s (%s)", chosen.name, chosen.label)
    return RelaxedChoice(
        mode=str(mode), skip=skip, reference=reference_figures(ref),
        candidates=cands, chosen=chosen, history=history, learned=learned, rule=rule,
        num_prompts=evaluator.num_prompts, max_new_tokens=evaluator.max_new_tokens,
    )
