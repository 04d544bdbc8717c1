"""Evaluate one skip set, in prompt chunks with early stopping when the evaluator allows it.

An evaluator opts in by exposing ``num_prompts`` and accepting ``evaluator(skip,
prompt_ids=[...])`` (see :class:`~tss_opt.search.Evaluator`). Prompts are then evaluated in
their fixed order, ``early_stop_chunk`` at a time; after each chunk, a skip set that is already
infeasible at the configured confidence
(:meth:`~tss_opt.search.feasibility.PairedFeasibility.hopeless`) stops, and its remaining
prompts are never generated.

The stop test spends the error rate over the looks (Bonferroni): with ``k`` interim looks
(``ceil(num_prompts / chunk) - 1``) each look uses the one-sided confidence
``1 - (1 - confidence) / k``. A set whose true mean loss is within the tolerance is then
stopped with probability at most ``1 - confidence`` over all looks (at the boundary; far less
with a margin), so early stopping rarely changes which sets are feasible, and a stopped set is
always recorded infeasible. The dense baseline runs every prompt (in the same chunks, so dense
and skip sets are measured the same way) and is never stopped.

With ``futility=True`` (``SearchSettings.futility_stopping``) a set also stops when
its final verdict can no longer pass
(:meth:`~tss_opt.search.feasibility.PairedFeasibility.futile`: the remaining prompts at their
upper prediction bound cannot lift the final lower bound to the tolerance), under the same
rules: at level 1 only when it can enter neither the feasible sets nor the candidate pool. Its
prediction bounds are Bonferroni-corrected over the looks and the two objectives,
``1 - (1 - confidence) / (2 k)``: a set that the full evaluation would pass is stopped with
probability at most ``1 - confidence`` (normal per-prompt differences; far less away from the
boundary).

Aggregates of a chunked evaluation equal one call over all its prompts. Per-prompt means (the
metric, tokens/s per prompt) are prompt-weighted means of the chunks'. When every chunk reports
its verification ``steps`` (the engine and replay evaluators do), the pooled ratios are pooled
again: accepted length = committed tokens / steps (committed = A x steps per chunk) and the
costs, which are per committed token (``cost``, ``cost_analytic``, ``cost_measured``), are
weighted by committed tokens; totals (``new_tokens``, ``steps``, ``wall_s``) are summed.
Without ``steps`` accepted length and cost fall back to prompt-weighted means (close for
similar prompts). Lists are concatenated and other values taken from the last chunk.

No Optuna or torch here: the worker and the tests' pure drivers call it alike.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tss_opt.search.algorithm import Config, Measurement, canonical
from tss_opt.search.contract import EvaluatorError, measurement_from
from tss_opt.search.feasibility import PairedFeasibility, PerPrompt

__all__ = ["ChunkedRun", "TrialEvaluation", "drive", "evaluate_skip_sets", "merge_chunks"]


@dataclass
class TrialEvaluation:
    """What evaluating one skip set gave.

    Attributes:
        measurement: The objectives (over the prompts used) and per-prompt values.
        extras: The evaluator's other keys, JSON-safe.
        prompts_used: Prompts evaluated (``None``: one plain call, count unknown unless
            ``per_prompt`` was returned).
        early_stopped: Stopped before the last prompt (then infeasible).
        stop_reason: Why it stopped ("" when not stopped).
        calls: Evaluator calls made.
    """

    measurement: Measurement
    extras: dict[str, Any] = field(default_factory=dict)
    prompts_used: int | None = None
    early_stopped: bool = False
    stop_reason: str = ""
    calls: int = 1


def drive(evaluator: Any, run: ChunkedRun) -> TrialEvaluation:
    """Evaluate one skip set: run ``run`` to its end with one evaluator call per step (one
    plain call, or one per chunk of prompts with early stopping; see :class:`ChunkedRun`).

    Raises:
        EvaluatorError: A chunk's answer is malformed or its ``per_prompt`` length differs
            from the prompts asked for.
    """
    skip = frozenset(run.config)
    while (ids := run.next_ids()) is not False:
        run.add(evaluator(skip) if ids is None else evaluator(skip, prompt_ids=ids))
    return run.result()


def evaluate_skip_sets(group_call: Any, runs: Sequence[ChunkedRun]) -> list[TrialEvaluation]:
    """Evaluate several skip sets together (grouped trials), chunk by chunk.

    Every run asks for the same prompts at each step (they share ``num_prompts`` and
    ``chunk``), so the runs still going are measured by one
    ``group_call(skips, prompt_ids=ids)`` (a list of evaluator answers, one per skip set);
    a run that stops early drops out of the group and the rest continue. Each run's result
    equals :func:`drive` of it alone, since the evaluator's per-prompt answers do not depend
    on the group.
    """
    while True:
        asking = [(run, run.next_ids()) for run in runs]
        asking = [(run, ids) for run, ids in asking if ids is not False]
        if not asking:
            return [run.result() for run in runs]
        ids = asking[0][1]
        if any(other != ids for _, other in asking):
            raise ValueError("grouped runs must ask for the same prompts at every step (same num_prompts and chunk)")
        skips = [frozenset(run.config) for run, _ in asking]
        answers = group_call(skips) if ids is None else group_call(skips, prompt_ids=ids)
        if len(answers) != len(asking):
            raise EvaluatorError(f"a grouped evaluation of {len(asking)} skip sets returned {len(answers)} answers")
        for (run, _), answer in zip(asking, answers, strict=True):
            run.add(answer)


class ChunkedRun:
    """The chunk-by-chunk evaluation of one skip set, driven from outside
    (:func:`drive` alone, :func:`evaluate_skip_sets` in a group).

    ``next_ids()`` says what to evaluate next: ``None`` for one plain call over all prompts, a
    list of prompt indices for the next chunk, or ``False`` when done; ``add(answer)`` takes
    the evaluator's answer for it.

    Args:
        config: The skip set.
        num_prompts: ``None``: call ``evaluator(config)`` once. Else evaluate prompts
            ``0 .. num_prompts-1`` through ``prompt_ids=`` in chunks.
        chunk: Prompts per chunk.
        rule: The paired rule; after each chunk but the last, a set it finds hopeless stops.
            ``None`` (dense baseline, or no early stopping): every prompt is evaluated.
        pool_rule: The tau rule, given for level-1 sets (see ``PairedFeasibility.hopeless``).
        futility: Also stop a set whose final verdict can no longer pass
            (``PairedFeasibility.futile``); needs ``rule``.
    """

    def __init__(
        self,
        config: Config,
        *,
        num_prompts: int | None = None,
        chunk: int = 4,
        rule: PairedFeasibility | None = None,
        pool_rule: PairedFeasibility | None = None,
        futility: bool = False,
    ) -> None:
        self.config = config
        self.num_prompts = num_prompts
        self.chunk = chunk
        self.futility = futility
        self.parts: list[tuple[int, Measurement, dict[str, Any]]] = []
        self.done = 0
        self.why = ""
        self._plain: TrialEvaluation | None = None
        looks = max(1, math.ceil(num_prompts / chunk) - 1) if num_prompts is not None else 1
        self.final_rule, self.final_pool = rule, pool_rule  # futility: the final verdict's own confidence
        self.futility_conf = 1.0
        if rule is not None:
            stop_conf = 1.0 - (1.0 - rule.confidence) / looks
            # Futility: Bonferroni over the looks and the two objectives (either one stops a
            # set), so a set that all prompts would pass is stopped with probability <= 1 - confidence.
            self.futility_conf = 1.0 - (1.0 - rule.confidence) / (2 * looks)
            rule = dataclasses.replace(rule, confidence=stop_conf)
            if pool_rule is not None:
                pool_rule = dataclasses.replace(pool_rule, confidence=stop_conf)
        self.rule, self.pool_rule = rule, pool_rule

    def next_ids(self) -> list[int] | None | bool:
        """The prompts to evaluate next (``None``: all, one plain call; ``False``: finished)."""
        if self.num_prompts is None:
            return None if self._plain is None else False
        if self.why or self.done >= self.num_prompts:
            return False
        return list(range(self.done, min(self.done + self.chunk, self.num_prompts)))

    def add(self, answer: Any) -> None:
        """Take the evaluator's answer for :meth:`next_ids`; decide whether to stop."""
        if self.num_prompts is None:
            m, extras = measurement_from(answer, self.config)
            n = None if m.per_prompt is None else m.per_prompt.n
            self._plain = TrialEvaluation(m, extras, n)
            return
        ids = self.next_ids()
        assert isinstance(ids, list)
        m, extras = measurement_from(answer, self.config)
        got = -1 if m.per_prompt is None else m.per_prompt.n
        if got != len(ids):
            raise EvaluatorError(
                f"evaluator(skip={list(canonical(self.config))}, prompt_ids={ids}) returned "
                + ("no per_prompt" if got < 0 else f"per_prompt of length {got}")
                + f"; expected {len(ids)} entries, one per requested prompt, in that order."
            )
        self.parts.append((len(ids), m, extras))
        self.done += len(ids)
        if self.rule is not None and self.done < self.num_prompts:
            pp = PerPrompt.concat([p[1].per_prompt for p in self.parts])  # type: ignore[misc]
            why = self.rule.hopeless(pp, pool=self.pool_rule)
            if not why and self.futility and self.final_rule is not None:
                why = self.final_rule.futile(pp, self.num_prompts, self.futility_conf, pool=self.final_pool)
            self.why = why

    def result(self) -> TrialEvaluation:
        """What the evaluation gave (after :meth:`next_ids` returned ``False``)."""
        if self.num_prompts is None:
            assert self._plain is not None, "result() before the evaluation ran"
            return self._plain
        m, extras = merge_chunks(self.parts)
        return TrialEvaluation(m, extras, self.done, bool(self.why), self.why, len(self.parts))


# Extra keys of the engine's and replay evaluator's results: totals over prompts (summed
# across chunks) and costs per committed token (pooled by committed tokens, as the ``cost``
# objective is).
TOTALS: tuple[str, ...] = ("new_tokens", "steps", "wall_s")
PER_COMMITTED_TOKEN: tuple[str, ...] = ("cost_analytic", "cost_measured")


def merge_chunks(
    parts: Sequence[tuple[int, Measurement, dict[str, Any]]],
) -> tuple[Measurement, dict[str, Any]]:
    """Combine chunk results into what one call over all their prompts gives (module docstring)."""
    weights = [w for w, _, _ in parts]
    ms = [m for _, m, _ in parts]
    extras = [e for _, _, e in parts]

    def wmean(xs: Sequence[float], ws: Sequence[float] = weights) -> float:
        return math.fsum(w * x for w, x in zip(ws, xs, strict=True)) / math.fsum(ws)

    steps = [e.get("steps") for e in extras]
    committed: list[float] | None = None
    if all(isinstance(n, (int, float)) and not isinstance(n, bool) and n > 0 for n in steps):
        committed = [m.accept_length * float(n) for m, n in zip(ms, steps, strict=True)]  # type: ignore[arg-type]
        accept_length = math.fsum(committed) / math.fsum(float(n) for n in steps)  # type: ignore[arg-type]
        cost = wmean([m.cost for m in ms], committed)
    else:
        accept_length, cost = wmean([m.accept_length for m in ms]), wmean([m.cost for m in ms])
    tps = [m.tokens_per_s for m in ms]
    m = Measurement(
        accept_length=accept_length,
        metric=wmean([m.metric for m in ms]),
        cost=cost,
        tokens_per_s=None if any(t is None for t in tps) else wmean(tps),  # type: ignore[arg-type]
        per_prompt=PerPrompt.concat([m.per_prompt for m in ms]),  # type: ignore[misc]
    )
    merged = _merge_values(weights, extras)
    for key in TOTALS:
        if _numbers([e.get(key) for e in extras]):
            merged[key] = sum(e[key] for e in extras)
    if committed is not None:
        for key in PER_COMMITTED_TOKEN:
            if _numbers([e.get(key) for e in extras]):
                merged[key] = wmean([float(e[key]) for e in extras], committed)
    return m, merged


def _numbers(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _merge_values(weights: Sequence[int], values: Sequence[Any]) -> Any:
    last = values[-1]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        total = sum(weights)
        return math.fsum(w * float(v) for w, v in zip(weights, values, strict=True)) / total
    if all(isinstance(v, dict) for v in values):
        keys = [k for k in last if all(k in v for v in values)]
        merged = {k: _merge_values(weights, [v[k] for v in values]) for k in keys}
        merged.update({k: v for k, v in last.items() if k not in merged})
        return merged
    if all(isinstance(v, list) for v in values):
        return [x for v in values for x in v]
    return last
