"""DIVERSED's context-dependent weight (``verification=diversed``, lossy).

DIVERSED keeps a rejected draft token ``x`` when it wins against the blend
``w * p_target + (1 - w) * p_draft``. With a :class:`WeightPolicy` the weight is chosen per
draft token from both distributions at that token: the same :data:`FEATURES` as CoSpec's
arbitration (``p_target(x)``, ``p_draft(x)``, ``p_target(y)``, ``p_draft(y)`` with ``y`` the
target's token, i.e. its argmax when greedy, and both normalised entropies).

A fixed ``w`` is no policy: it is ``Verifier(weight=w)``, one number per domain.

- :class:`LearnedWeight`: ``w = sigmoid(theta . features)``, trained on calibration prompts by
  :func:`tss_opt.training.relaxed.train_diversed_weight` (REINFORCE with a logit-normal
  exploration: while training, ``z ~ N(theta . features, sigma^2)`` and ``w = sigmoid(z)``).

The weight is only asked where exact verification rejects the draft token (where ``w``
changes the outcome), so any ``w`` in [0, 1] accepts at least what exact verification accepts.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch

from tss_opt.decoding.verify.arbitration import FEATURES, LinearFeaturePolicy
from tss_opt.errors import TSSError

KIND = "diversed_weight"
"""The ``kind`` written into a learned weight's JSON, so a CoSpec policy file is not read as one."""


class WeightPolicy(ABC):
    """Gives DIVERSED's target share ``w`` in [0, 1] for one draft token."""

    name: str = "weight"

    def begin_request(self) -> None:
        """Called once per request (the engine's prefill); learning policies start an episode."""

    @abstractmethod
    def weight(self, features: torch.Tensor) -> float:
        """``w`` in [0, 1] for one draft token (1 = exact verification, 0 = trust the draft).

        Args:
            features: ``torch.DoubleTensor`` of shape ``(len(FEATURES),)`` from
                :func:`tss_opt.decoding.verify.arbitration.mismatch_features`.
        """


def _logit(w: float) -> float:
    w = min(max(w, 1e-6), 1.0 - 1e-6)
    return math.log(w / (1.0 - w))


class LearnedWeight(LinearFeaturePolicy, WeightPolicy):
    """``w = sigmoid(theta . features)``: deterministic unless ``training``.

    While training, each call draws ``z ~ N(theta . features, sigma^2)`` from the policy's own
    seeded generator, answers ``sigmoid(z)`` and records ``(features, z, mean)`` in the current
    request's episode (:attr:`episodes`, one list per request), which REINFORCE turns into a
    gradient: ``d log N(z; mu, sigma) / d theta = (z - mu) / sigma^2 * features``.

    Weights, episodes and the JSON file (``{"kind": "diversed_weight", ...}``) come from
    :class:`~tss_opt.decoding.verify.arbitration.LinearFeaturePolicy`.

    Args:
        theta: ``(len(FEATURES),)`` weights; default: the bias gives ``init_weight`` everywhere.
        init_weight: the starting ``w`` when ``theta`` is not given (0.8: close to exact).
        sigma: exploration noise, in logits, while training.
        seed: the exploration generator's seed.
    """

    name = "learned"
    kind = KIND
    what = "DIVERSED weight policy"
    missing_hint = (
        "train one with python -m tss_opt.cli.tune_verification verification=diversed (docs/engine.md) "
        "or drop relaxed.weight_policy"
    )
    kind_hint = "a CoSpec policy goes to relaxed.policy, a DIVERSED weight to relaxed.weight_policy"

    def __init__(
        self, theta: torch.Tensor | None = None, *, init_weight: float = 0.8, sigma: float = 1.0, seed: int = 0
    ) -> None:
        if theta is None:
            theta = torch.zeros(len(FEATURES), dtype=torch.float64)
            theta[0] = _logit(float(init_weight))
        super().__init__(theta, seed)
        if not sigma > 0:
            raise TSSError(f"DIVERSED weight exploration sigma={sigma} must be > 0")
        self.sigma = float(sigma)

    def mean_logit(self, features: torch.Tensor) -> float:
        """``mu = theta . features``, the logit of the deterministic weight."""
        return self.logit(features)

    def weight(self, features: torch.Tensor) -> float:
        mu = self.mean_logit(features)
        if not self.training:
            return 1.0 / (1.0 + math.exp(-mu)) if mu > -700 else 0.0
        z = mu + self.sigma * float(torch.randn((), generator=self._gen, dtype=torch.float64))
        self._record(features, z, mu)
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0
