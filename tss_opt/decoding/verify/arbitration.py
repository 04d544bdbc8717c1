"""CoSpec arbitration policies: at the first mismatch of a step, keep the draft's token or the
target's (``verification=cospec``, lossy).

A policy sees :func:`mismatch_features` of both distributions at the mismatch and answers
"keep the draft token". :class:`ThresholdPolicy` is the fixed baseline (with both thresholds at
1 it never keeps one: exact verification token for token); :class:`LogisticPolicy` is the
learned one (trained with REINFORCE by :func:`tss_opt.training.relaxed.train_cospec_policy`).

:class:`LinearFeaturePolicy` holds what every learned rule over :data:`FEATURES` shares (the
weights, the training episodes, the JSON file with its ``kind``): CoSpec's
:class:`LogisticPolicy` and DIVERSED's
:class:`~tss_opt.decoding.verify.blend_weight.LearnedWeight` build on it.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar, TypeVar

import torch

from tss_opt.config.schema import RelaxedSettings
from tss_opt.errors import TSSError

FEATURES: tuple[str, ...] = (
    "bias",
    "p_target(draft)",
    "p_draft(draft)",
    "p_target(target)",
    "p_draft(target)",
    "entropy_target",
    "entropy_draft",
)
"""The features of a mismatch, in order (entropies divided by ``log(vocab)``, so all lie in [0, 1])."""

KIND = "cospec_policy"
"""The ``kind`` written into a learned policy's JSON (a DIVERSED weight file has the same features)."""


def _entropy(p: torch.Tensor) -> float:
    p = p.double().clamp_min(1e-30)
    return float(-(p * p.log()).sum()) / math.log(p.numel())


def mismatch_features(p: torch.Tensor, q: torch.Tensor, draft_token: int, target_token: int) -> torch.Tensor:
    """The features :data:`FEATURES` of one mismatch.

    Args:
        p: ``(vocab,)`` the target's distribution at the mismatch.
        q: ``(vocab,)`` the drafter's distribution for the draft token.
        draft_token: the draft's token ``x``; ``target_token``: the target's ``y != x``.

    Returns:
        ``torch.DoubleTensor`` of shape ``(len(FEATURES),)``.
    """
    p, q = p.double(), q.double()
    x, y = int(draft_token), int(target_token)
    return torch.tensor(
        [1.0, float(p[x]), float(q[x]), float(p[y]), float(q[y]), _entropy(p), _entropy(q)], dtype=torch.float64
    )


class ArbitrationPolicy(ABC):
    """Decides, at a step's first mismatch, whether the draft's token is kept."""

    name: str = "policy"

    def begin_request(self) -> None:
        """Called once per request (the engine's prefill); learning policies start an episode."""

    @abstractmethod
    def keep_draft(self, features: torch.Tensor) -> bool:
        """True keeps the draft token (lossy), False the target's (exact).

        Args:
            features: ``(len(FEATURES),)`` from :func:`mismatch_features`.
        """


class ThresholdPolicy(ArbitrationPolicy):
    """The fixed baseline: keep the draft token ``x`` when ``p_draft(x) > tau_draft`` and
    ``p_target(x) > tau_target`` (both confident enough that ``x`` is a fair continuation).

    Args:
        tau_draft, tau_target: thresholds in [0, 1].
    """

    name = "threshold"

    def __init__(
        self, tau_draft: float = RelaxedSettings.tau_draft, tau_target: float = RelaxedSettings.tau_target
    ) -> None:
        for label, v in (("tau_draft", tau_draft), ("tau_target", tau_target)):
            if not 0.0 <= v <= 1.0:
                raise TSSError(f"CoSpec {label}={v} is outside [0, 1]; give a probability threshold in [0, 1]")
        self.tau_draft = float(tau_draft)
        self.tau_target = float(tau_target)

    def keep_draft(self, features: torch.Tensor) -> bool:
        return bool(features[2] > self.tau_draft and features[1] > self.tau_target)


_P = TypeVar("_P", bound="LinearFeaturePolicy")


class LinearFeaturePolicy:
    """Weights ``theta`` over :data:`FEATURES`, the logit ``theta . features``, a training mode
    that records each request's decisions, and persistence as JSON with a ``kind`` marker.

    The learned rules (CoSpec's :class:`LogisticPolicy`, DIVERSED's
    :class:`~tss_opt.decoding.verify.blend_weight.LearnedWeight`) subclass it and say how
    the logit becomes a decision; their files have the same features, so ``kind`` keeps one
    from being read as the other.

    Class attributes:
        kind: the ``kind`` written into the JSON file.
        what: the rule's name in messages (``CoSpec policy``).
        missing_hint: how to get a file, for a missing one.
        kind_hint: where each kind of file goes, for a file of another kind.
        kindless_ok: accept a file without ``kind`` (files written before the marker existed).

    Attributes:
        theta: ``torch.DoubleTensor`` of shape ``(len(FEATURES),)``.
        training: sample decisions and record them in :attr:`episodes` (one list per request,
            entries ``(features, action, statistic)`` as the subclass defines them).
    """

    kind: ClassVar[str]
    what: ClassVar[str]
    missing_hint: ClassVar[str]
    kind_hint: ClassVar[str]
    kindless_ok: ClassVar[bool] = False

    def __init__(self, theta: torch.Tensor, seed: int) -> None:
        self.theta = torch.as_tensor(theta, dtype=torch.float64).clone()
        if self.theta.shape != (len(FEATURES),):
            raise TSSError(
                f"a {self.what} needs {len(FEATURES)} weights ({', '.join(FEATURES)}), got shape "
                f"{tuple(self.theta.shape)}"
            )
        self.training = False
        self.episodes: list[list[tuple[torch.Tensor, float, float]]] = []
        self._gen = torch.Generator().manual_seed(seed)

    def logit(self, features: torch.Tensor) -> float:
        """``theta . features`` for one ``(len(FEATURES),)`` feature vector."""
        return float(self.theta @ features.double())

    def begin_request(self) -> None:
        if self.training:
            self.episodes.append([])

    def _record(self, features: torch.Tensor, action: float, statistic: float) -> None:
        """Append one training decision to the current request's episode."""
        if not self.episodes:
            self.episodes.append([])
        self.episodes[-1].append((features.double(), action, statistic))

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """Write ``{"kind": <kind>, "features": [...], "theta": [...]}`` as JSON."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(
            json.dumps({"kind": self.kind, "features": list(FEATURES), "theta": self.theta.tolist()}, indent=2),
            encoding="utf-8",
        )
        return p

    @classmethod
    def load(cls: type[_P], path: str | Path) -> _P:
        """Read weights written by :meth:`save`.

        Raises:
            TSSError: a missing file, a file of another kind, other features.
        """
        p = Path(path)
        if not p.is_file():
            raise TSSError(f"{cls.what} file {str(p)!r} does not exist; {cls.missing_hint}")
        data = json.loads(p.read_text(encoding="utf-8"))
        kind = data.get("kind", cls.kind if cls.kindless_ok else None)
        if kind != cls.kind:
            raise TSSError(
                f"{str(p)!r} is not a {cls.what} (kind {data.get('kind')!r}, expected {cls.kind!r}); {cls.kind_hint}"
            )
        if list(data.get("features", [])) != list(FEATURES):
            raise TSSError(
                f"{cls.what} {str(p)!r} was trained on features {data.get('features')}; this version uses "
                f"{list(FEATURES)}: retrain it"
            )
        return cls(torch.tensor(data["theta"], dtype=torch.float64))


class LogisticPolicy(LinearFeaturePolicy, ArbitrationPolicy):
    """``P(keep draft) = sigmoid(theta . features)``; greedy (``> 0.5``) unless ``training``.

    While training it samples its decisions from its own seeded generator and records each
    request's ``(features, action, probability)`` in :attr:`episodes` (one list per request),
    which REINFORCE turns into a gradient.

    Args:
        theta: ``(len(FEATURES),)`` weights; default: a bias of -2 (keeps rarely at start).
    """

    name = "learned"
    kind = KIND
    what = "CoSpec policy"
    missing_hint = "train one (docs/engine.md) or drop the path"
    kind_hint = "a DIVERSED weight goes to relaxed.weight_policy, a CoSpec policy to relaxed.policy"
    # Files written before the kind existed carry none; a DIVERSED weight has the same
    # features and must not be read as an arbitration policy.
    kindless_ok = True

    def __init__(self, theta: torch.Tensor | None = None, seed: int = 0) -> None:
        if theta is None:
            theta = torch.zeros(len(FEATURES), dtype=torch.float64)
            theta[0] = -2.0
        super().__init__(theta, seed)

    def prob(self, features: torch.Tensor) -> float:
        return float(torch.sigmoid(self.theta @ features.double()))

    def keep_draft(self, features: torch.Tensor) -> bool:
        pi = self.prob(features)
        if not self.training:
            return pi > 0.5
        keep = bool(float(torch.rand((), generator=self._gen, dtype=torch.float64)) < pi)
        self._record(features, int(keep), pi)
        return keep
