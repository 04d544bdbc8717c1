"""The metric contract and the registry of metrics by name.

A metric scores a list of predictions against, per example, a list of acceptable references.
Its direction (``higher_is_better``) travels with it, so the search can set an Optuna study
direction from the metric alone, as lm-evaluation-harness does for its metric registry.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tss_opt.errors import TSSError

__all__ = [
    "Metric",
    "MetricResult",
    "UnknownMetricError",
    "available_metrics",
    "get_metric",
    "register_metric",
]

PerExampleFn = Callable[[str, Sequence[str]], float]
"""Scores one prediction against its references (the best match, by convention)."""

ExtrasFn = Callable[[Sequence[str], Sequence[Sequence[str]]], Mapping[str, float]]
"""Corpus-level numbers reported beside the mean (e.g. corpus BLEU)."""


@dataclass(frozen=True)
class MetricResult:
    """The outcome of scoring a batch of predictions.

    Attributes:
        value: The aggregate score, the search objective (the mean of ``per_example`` for the
            built-in metrics).
        per_example: One score per prediction, in input order.
        extras: Further named numbers reported beside ``value`` (may be empty).
    """

    value: float
    per_example: list[float]
    extras: dict[str, float] = field(default_factory=dict)


class UnknownMetricError(KeyError, TSSError):
    """Raised for a metric name that is not registered.

    Both a ``KeyError`` (a failed lookup) and a ``ValueError`` (bad user input), so callers can
    catch either. ``str()`` gives the plain message, not ``KeyError``'s quoted repr.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Metric:
    """A named task metric with a direction.

    The default :meth:`score` averages a per-example function; subclass and override
    :meth:`score` for a metric that is not a mean (then pass any ``per_example`` callable that
    scores one example, used for the per-example breakdown).

    Attributes:
        name: The registry key, used in domain configs (``metric: rouge_l``).
        higher_is_better: The optimisation direction of the metric.
        needs_references: Whether every example must carry at least one reference.
        description: One line for docs and listings.
    """

    def __init__(
        self,
        name: str,
        per_example: PerExampleFn,
        *,
        higher_is_better: bool = True,
        needs_references: bool = True,
        extras: ExtrasFn | None = None,
        description: str = "",
    ) -> None:
        self.name = name
        self.higher_is_better = higher_is_better
        self.needs_references = needs_references
        self.description = description
        self._per_example = per_example
        self._extras = extras

    def __repr__(self) -> str:
        direction = "max" if self.higher_is_better else "min"
        return f"Metric({self.name!r}, {direction})"

    def score(
        self, predictions: Sequence[str], references: Sequence[Sequence[str]]
    ) -> MetricResult:
        """Scores predictions against their references.

        Args:
            predictions: One generated text per example.
            references: Per example, the acceptable reference texts (best match counts). May
                hold empty sequences only when ``needs_references`` is false.

        Returns:
            The mean per-example score as ``value``, the per-example scores, and extras.

        Raises:
            ValueError: On mismatched lengths, an empty batch, a non-string prediction or
                reference, or an example without references when the metric needs one.
        """
        if isinstance(predictions, str) or isinstance(references, str):
            raise ValueError(
                f"Metric {self.name!r} takes a sequence of predictions and a sequence of "
                "reference lists, got a bare string; wrap single examples in lists."
            )
        if len(predictions) != len(references):
            raise ValueError(
                f"Metric {self.name!r}: {len(predictions)} predictions but {len(references)} "
                "reference lists; pass one reference list per prediction."
            )
        if not predictions:
            raise ValueError(f"Metric {self.name!r}: nothing to score (0 predictions).")
        refs_per_example: list[list[str]] = []
        for i, (pred, refs) in enumerate(zip(predictions, references, strict=True)):
            if not isinstance(pred, str):
                raise ValueError(
                    f"Metric {self.name!r}: prediction {i} is {type(pred).__name__}, expected str."
                )
            refs = [refs] if isinstance(refs, str) else list(refs)
            if not all(isinstance(r, str) for r in refs):
                raise ValueError(
                    f"Metric {self.name!r}: references of example {i} must be strings."
                )
            if self.needs_references and not refs:
                raise ValueError(
                    f"Metric {self.name!r} needs references, but example {i} has none; add at "
                    "least one reference or choose a reference-free metric."
                )
            refs_per_example.append(refs)
        scores = [
            float(self._per_example(p, r))
            for p, r in zip(predictions, refs_per_example, strict=True)
        ]
        extras = dict(self._extras(predictions, refs_per_example)) if self._extras else {}
        return MetricResult(
            value=math.fsum(scores) / len(scores), per_example=scores, extras=extras
        )


_REGISTRY: dict[str, Metric] = {}


def register_metric(metric: Metric, *, replace: bool = False) -> Metric:
    """Adds a metric to the registry under ``metric.name``.

    Args:
        metric: The metric to register.
        replace: Allow overwriting an existing entry of the same name.

    Returns:
        The metric itself, so a module can write ``BLEU = register_metric(Metric(...))``.

    Raises:
        ValueError: If the name is already taken and ``replace`` is false.
    """
    if not metric.name or not isinstance(metric.name, str):
        raise ValueError(f"Metric name must be a non-empty string, got {metric.name!r}.")
    if metric.name in _REGISTRY and not replace:
        raise ValueError(
            f"Metric {metric.name!r} is already registered; pick another name or pass "
            "replace=True to override it."
        )
    _REGISTRY[metric.name] = metric
    return metric


def available_metrics() -> list[str]:
    """Returns the registered metric names, sorted."""
    return sorted(_REGISTRY)


def get_metric(name: str) -> Metric:
    """Looks a metric up by name.

    Raises:
        UnknownMetricError: If ``name`` is not registered; the message suggests the closest
            name and lists all of them.
    """
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        pass
    close = difflib.get_close_matches(str(name), available_metrics(), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise UnknownMetricError(
        f"Unknown metric {name!r}.{hint} Available: {', '.join(available_metrics())}"
    )
