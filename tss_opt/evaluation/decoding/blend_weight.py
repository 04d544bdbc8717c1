"""DIVERSED's context-dependent weight (``verification=diversed``, lossy; issue 13).

DIVERSED keeps a rejected draft token ``x`` when it wins against the blend
``w * p_target + (1 - w) * p_draft``. With a :class:`WeightPolicy` the weight is chosen per
draft token from both distributions at that token: the same :data:`FEATURES` as CoSpec's
arbitration (``p_target(x)``, ``p_draft(x)``, ``p_target(y)``, ``p_draft(y)`` with ``y`` the
target's token, i.e. its argmax when greedy, and both normalised entropies).

- :class:`FixedWeight`: one ``w`` everywhere (the searched per-domain weight as a policy).
- :class:`LearnedWeight`: ``w = sigmoid(theta . features)``, trained on calibration prompts by
  :func:`tss_opt.evaluation.relaxed.train_diversed_weight` (REINFORCE with a logit-normal
  exploration: while training, ``z ~ N(theta . features, sigma^2)`` and ``w = sigmoid(z)``).

The weight is only asked where exact verification rejects the draft token (where ``w``
changes the outcome), so any ``w`` in [0, 1] accepts at least what exact verification accepts.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from pathlib import Path

import torch

from tss_opt.errors import TSSError
from tss_opt.evaluation.decoding.arbitration import FEATURES

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
                :func:`tss_opt.evaluation.decoding.arbitration.mismatch_features`.
        """


class FixedWeight(WeightPolicy):
    """The same ``w`` for every token (``FixedWeight(1.0)`` is exact verification)."""

    def __init__(self, w: float) -> None:
        if not 0.0 <= float(w) <= 1.0:
            raise TSSError(f"DIVERSED weight w={w} is outside [0, 1]; give a value in [0, 1]")
        self.w = float(w)
        self.name = f"{self.w:.2f}"

    def weight(self, features: torch.Tensor) -> float:
        return self.w


def _logit(w: float) -> float:
    w = min(max(w, 1e-6), 1.0 - 1e-6)
    return math.log(w / (1.0 - w))


class LearnedWeight(WeightPolicy):
    """``w = sigmoid(theta . features)``: deterministic unless ``training``.

    While training, each call draws ``z ~ N(theta . features, sigma^2)`` from the policy's own
    seeded generator, answers ``sigmoid(z)`` and records ``(features, z, mean)`` in the current
    request's episode (:attr:`episodes`, one list per request), which REINFORCE turns into a
    gradient: ``d log N(z; mu, sigma) / d theta = (z - mu) / sigma^2 * features``.

    Args:
        theta: ``(len(FEATURES),)`` weights; default: the bias gives ``init_weight`` everywhere.
        init_weight: the starting ``w`` when ``theta`` is not given (0.8: close to exact).
        sigma: exploration noise, in logits, while training.
        seed: the exploration generator's seed.
    """

    name = "learned"

    def __init__(
        self, theta: torch.Tensor | None = None, *, init_weight: float = 0.8, sigma: float = 1.0, seed: int = 0
    ) -> None:
        if theta is None:
            theta = torch.zeros(len(FEATURES), dtype=torch.float64)
            theta[0] = _logit(float(init_weight))
        self.theta = torch.as_tensor(theta, dtype=torch.float64).clone()
        if self.theta.shape != (len(FEATURES),):
            raise TSSError(
                f"a DIVERSED weight policy needs {len(FEATURES)} weights ({', '.join(FEATURES)}), got shape "
                f"{tuple(self.theta.shape)}"
            )
        if not sigma > 0:
            raise TSSError(f"DIVERSED weight exploration sigma={sigma} must be > 0")
        self.sigma = float(sigma)
        self.training = False
        self.episodes: list[list[tuple[torch.Tensor, float, float]]] = []
        self._gen = torch.Generator().manual_seed(seed)

    def mean_logit(self, features: torch.Tensor) -> float:
        return float(self.theta @ features.double())

    def begin_request(self) -> None:
        if self.training:
            self.episodes.append([])

    def weight(self, features: torch.Tensor) -> float:
        mu = self.mean_logit(features)
        if not self.training:
            return 1.0 / (1.0 + math.exp(-mu)) if mu > -700 else 0.0
        z = mu + self.sigma * float(torch.randn((), generator=self._gen, dtype=torch.float64))
        if not self.episodes:
            self.episodes.append([])
        self.episodes[-1].append((features.double(), z, mu))
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """Write ``{"kind": "diversed_weight", "features": [...], "theta": [...]}`` as JSON."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(
            json.dumps({"kind": KIND, "features": list(FEATURES), "theta": self.theta.tolist()}, indent=2),
            encoding="utf-8",
        )
        return p

    @classmethod
    def load(cls, path: str | Path) -> LearnedWeight:
        """Read weights written by :meth:`save`.

        Raises:
            TSSError: a missing file, a file of another kind (a CoSpec policy), other features.
        """
        p = Path(path)
        if not p.is_file():
            raise TSSError(
                f"DIVERSED weight policy file {str(p)!r} does not exist; train one with "
                "python -m tss_opt.cli.tune_verification verification=diversed (docs/engine.md) or drop relaxed.weight_policy"
            )
        data = json.loads(p.read_text(encoding="utf-8"))
        if data.get("kind") != KIND:
            raise TSSError(
                f"{str(p)!r} is not a DIVERSED weight policy (kind {data.get('kind')!r}, expected {KIND!r}); "
                "a CoSpec policy goes to relaxed.policy, a DIVERSED weight to relaxed.weight_policy"
            )
        if list(data.get("features", [])) != list(FEATURES):
            raise TSSError(
                f"DIVERSED weight policy {str(p)!r} was trained on features {data.get('features')}; this version uses "
                f"{list(FEATURES)}: retrain it"
            )
        return cls(torch.tensor(data["theta"], dtype=torch.float64))
