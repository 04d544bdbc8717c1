"""Relaxed verification: DIVERSED and CoSpec acceptance, both lossy by design.

:class:`Verifier` is what the engine's ``accept`` step asks. ``exact`` keeps today's rules
(:mod:`tss_opt.decoding.verify.accept`). The relaxed modes accept everything exact
verification accepts, and more:

- ``diversed``: a draft token ``x`` with draft distribution ``q`` (``DraftTree.probs``) is also
  kept against the blend ``b = w * p + (1 - w) * q``. Greedy: ``x`` is the argmax of ``b`` (or
  of ``p``, the exact rule). Temperature > 0, sampled chains: rejection sampling against ``b``
  (keep with ``min(1, b(x) / q(x))``, residual ``max(b - q, 0)``). Temperature > 0,
  deterministic drafts: the coupled rule (:func:`accept_coupled`) with the same positional
  uniform drawing from ``p`` and from ``b``; ``x`` is kept when either draw is ``x``. ``w = 1``
  is exact verification token for token. The weight is one number per domain, or a
  :class:`~tss_opt.decoding.verify.blend_weight.WeightPolicy` that gives ``w`` per draft
  token from both distributions there (the learned, context-dependent weight); it is asked only
  where exact verification rejects ``x``.
- ``cospec``: at the first mismatch of a step an :class:`ArbitrationPolicy` sees features of
  both distributions and keeps the draft's token or the target's; afterwards the exact rule
  continues. :class:`ThresholdPolicy` with both thresholds at 1 is exact verification token for token.

On a rejection the committed token is always the target's (its argmax, its coupled draw or the
residual draw), so the output differs from exact decoding only through kept draft tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tss_opt.config.enums import Verification
from tss_opt.config.schema import RelaxedSettings
from tss_opt.decoding.drafter import Drafter
from tss_opt.decoding.tree import DraftTree
from tss_opt.decoding.verify.accept import PositionalSampler
from tss_opt.decoding.verify.arbitration import (
    ArbitrationPolicy,
    ThresholdPolicy,
    mismatch_features,
)
from tss_opt.decoding.verify.blend_weight import WeightPolicy
from tss_opt.errors import TSSError


class RelaxedVerificationError(TSSError):
    """A relaxed verification setting the user must fix (mode, weight, drafter)."""


def check_weight(weight: float) -> float:
    """``weight`` as a float in [0, 1], or :class:`RelaxedVerificationError` giving the range."""
    w = float(weight)
    if not 0.0 <= w <= 1.0:
        raise RelaxedVerificationError(
            f"DIVERSED weight w={weight} is outside [0, 1]; w = 1 is exact verification, w = 0 trusts "
            "the draft alone: give a value in [0, 1]"
        )
    return w


def refuse_drafter(
    mode: Verification | str, drafter_name: str, supported: Sequence[str] = ()
) -> RelaxedVerificationError:
    """The error for a relaxed mode with a drafter that gives no distribution.

    ``supported``: the shipped drafters that give one, named by callers that know the
    registry (``tss_opt.decoding.drafters.registry.distribution_drafters()``); this module
    sits below the registry and does not import it.
    """
    use = f"use one of: {', '.join(supported)}" if supported else (
        "use a drafter whose capabilities declare a distribution (the shipped ones: "
        "tss_opt.decoding.drafters.registry.distribution_drafters())"
    )
    return RelaxedVerificationError(
        f"verification={mode} needs a drafter that gives a distribution per draft token, but drafter "
        f"{drafter_name!r} gives none; {use} (or verification=exact)"
    )


@dataclass
class Verifier:
    """The acceptance rule of the engine's ``accept`` step.

    Attributes:
        mode: ``exact`` (default, lossless), ``diversed`` or ``cospec`` (lossy).
        weight: DIVERSED's ``w`` in [0, 1] (the target's share of the blend).
        policy: CoSpec's arbitration policy (default: :class:`ThresholdPolicy`).
        weight_policy: DIVERSED's context-dependent weight; when set it replaces ``weight``.
    """

    mode: Verification = Verification.exact
    weight: float = 1.0
    policy: ArbitrationPolicy | None = None
    weight_policy: WeightPolicy | None = None

    def __post_init__(self) -> None:
        self.mode = Verification.parse("verification", self.mode)
        self.weight = check_weight(self.weight)
        if self.mode is Verification.cospec and self.policy is None:
            self.policy = ThresholdPolicy()
        if self.weight_policy is not None and self.mode is not Verification.diversed:
            raise RelaxedVerificationError(
                f"a DIVERSED weight policy was given with verification={self.mode}; it needs verification=diversed "
                "(drop relaxed.weight_policy for other modes)"
            )

    @property
    def lossy(self) -> bool:
        """True for the relaxed modes: the output may differ from the target's own."""
        return self.mode.lossy

    def describe(self) -> str:
        """A short label: ``exact``, ``diversed(w=0.60)``, ``diversed(w=learned)``, ``cospec(threshold)``."""
        if self.mode is Verification.diversed:
            if self.weight_policy is not None:
                return f"diversed(w={self.weight_policy.name})"
            return f"diversed(w={self.weight:.2f})"
        if self.mode is Verification.cospec:
            return f"cospec({getattr(self.policy, 'name', 'policy')})"
        return "exact"

    def prepare(self, drafter: Drafter) -> None:
        """Check that ``drafter`` suits the mode and ask it for its distributions.

        Raises:
            RelaxedVerificationError: a relaxed mode with a drafter that gives no distribution.
        """
        if not self.lossy:
            return
        if not drafter.capabilities.distribution:
            raise refuse_drafter(self.mode, type(drafter).__name__)
        drafter.return_probs = True  # type: ignore[attr-defined]

    def begin_request(self) -> None:
        if self.policy is not None:
            self.policy.begin_request()
        if self.weight_policy is not None:
            self.weight_policy.begin_request()

    def weight_at(self, p: torch.Tensor, q: torch.Tensor, x: int, y: int) -> float:
        """DIVERSED's ``w`` for draft token ``x`` (``y``: the target's token): the fixed weight,
        or the weight policy's answer on :func:`mismatch_features`.

        Args:
            p, q: ``(vocab,)`` the target's and the drafter's distributions at the token.
        """
        if self.weight_policy is None:
            return self.weight
        w = float(self.weight_policy.weight(mismatch_features(p, q, x, y)))
        if not 0.0 <= w <= 1.0:  # a user's policy: never let it leave the range silently
            raise RelaxedVerificationError(
                f"DIVERSED weight policy {self.weight_policy.name!r} returned w={w}, outside [0, 1]; it must "
                "return a weight in [0, 1]"
            )
        return w

    # ------------------------------------------------------------------ acceptance
    def accept(
        self,
        tree: DraftTree,
        logits: torch.Tensor,
        *,
        temperature: float,
        sampler: PositionalSampler | None,
        generator: torch.Generator | None,
        position: int,
    ) -> tuple[list[int], list[int], int]:
        """The relaxed rule of this step.

        Args:
            logits: ``(n + 1, vocab)`` target logits, rows ``[root, node_0, ...]``.
            position: output position of the first token this step commits.

        Returns:
            ``(accepted, committed, relaxed)``: as :func:`accept_greedy`, plus how many accepted
            nodes exact verification would have rejected (0 means this step was exact).
        """
        if len(tree) and tree.probs is None:
            raise RelaxedVerificationError(
                f"verification={self.mode} got a draft without per-node distributions (DraftTree.probs); "
                "use a drafter whose capabilities declare a distribution (with return_probs; the shipped "
                "ones: tss_opt.decoding.drafters.registry.distribution_drafters())"
            )
        if sampler is not None and tree.sampled_probs is not None:
            return self._sampled_chain(tree, logits, temperature, generator)
        return self._walk(tree, logits, sampler, position)

    def _relax(self, p: torch.Tensor, q: torch.Tensor, x: int, want: int, draw) -> bool:  # noqa: ANN001
        """Whether the rejected draft token ``x`` is kept after all (``want``: the target's)."""
        if self.mode is Verification.diversed:
            w = self.weight_at(p, q, x, want)
            if w >= 1.0:
                return False
            blend = w * p + (1.0 - w) * q
            return draw(blend) == x
        if self.mode is Verification.cospec:
            assert self.policy is not None
            return self.policy.keep_draft(mismatch_features(p, q, x, want))
        return False

    def _walk(
        self, tree: DraftTree, logits: torch.Tensor, sampler: PositionalSampler | None, position: int
    ) -> tuple[list[int], list[int], int]:
        """Greedy (``sampler`` None) or coupled (deterministic drafts, temperature > 0) walk."""
        tokens = tree.tokens.tolist()
        kids = tree.children()
        accepted: list[int] = []
        relaxed, arbitrated, row = 0, False, 0
        greedy_choice = logits.argmax(dim=-1).tolist() if sampler is None else None
        while True:
            depth = len(accepted)
            if greedy_choice is not None:
                want = greedy_choice[row]
                p = None
            else:
                assert sampler is not None
                p = torch.softmax(logits[row].double() / sampler.temperature, dim=-1)
                want = sampler.draw_probs(p, position + depth)
            nxt = next((c for c in kids[row] if tokens[c] == want), None)
            if nxt is None and kids[row] and not (self.mode is Verification.cospec and arbitrated):
                if p is None:
                    p = torch.softmax(logits[row].double(), dim=-1)
                if greedy_choice is not None:
                    def draw(b: torch.Tensor) -> int:
                        return int(b.argmax())
                else:
                    def draw(b: torch.Tensor, _pos: int = position + depth) -> int:
                        assert sampler is not None
                        return sampler.draw_probs(b, _pos)
                assert tree.probs is not None
                # CoSpec arbitrates the child the drafter trusts most; DIVERSED tries each.
                order = sorted(kids[row], key=lambda c: -float(tree.probs[c, tokens[c]]))  # type: ignore[index]
                if self.mode is Verification.cospec:
                    order, arbitrated = order[:1], True
                for c in order:
                    q = tree.probs[c].double().to(p.device)
                    if self._relax(p, q, tokens[c], want, draw):
                        nxt = c
                        relaxed += 1
                        break
            if nxt is None:
                return accepted, [tokens[i] for i in accepted] + [want], relaxed
            accepted.append(nxt)
            row = nxt + 1

    def _sampled_chain(
        self, tree: DraftTree, logits: torch.Tensor, temperature: float, generator: torch.Generator | None
    ) -> tuple[list[int], list[int], int]:
        """Speculative sampling of a chain drawn from ``q`` (as :func:`accept_sampling`, the same
        draws in the same order), against the blend (DIVERSED) or with arbitration (CoSpec)."""
        if not tree.is_chain:
            raise ValueError(
                "speculative sampling (temperature > 0) verifies chains only, but the drafter proposed a "
                "branching tree; use temperature 0 with tree drafters"
            )
        assert tree.probs is not None
        p = torch.softmax(logits.float() / temperature, dim=-1)  # [n+1, V]
        tokens = tree.tokens.tolist()
        diversed = self.mode is Verification.diversed
        accepted: list[int] = []
        relaxed, arbitrated = 0, False
        for i, x in enumerate(tokens):
            q = tree.probs[i].float().to(p.device)
            qx, px = float(q[x]), float(p[i, x])
            u = float(torch.rand((), generator=generator, device=p.device))
            if qx > 0 and u < min(1.0, px / qx):  # exact speculative sampling keeps x
                accepted.append(i)
                continue
            # Exact rejects x: only now does the blend matter (b(x)/q(x) >= min(1, p(x)/q(x))
            # for any w in [0, 1], so acceptance never falls below exact's).
            w = self.weight_at(p[i], q, x, int(p[i].argmax())) if diversed else 1.0
            target = w * p[i] + (1.0 - w) * q if w < 1.0 else p[i]
            if qx > 0 and u < min(1.0, float(target[x]) / qx):
                accepted.append(i)
                relaxed += 1
                continue
            residual = (target.clone() - q).clamp_min_(0.0)
            if float(residual.sum()) <= 0:
                residual = target
            bonus = int(torch.multinomial(residual, 1, generator=generator))
            if self.mode is Verification.cospec and not arbitrated:
                arbitrated = True
                assert self.policy is not None
                if bonus != x and self.policy.keep_draft(mismatch_features(p[i], q, x, bonus)):
                    accepted.append(i)
                    relaxed += 1
                    continue
            return accepted, [tokens[j] for j in accepted] + [bonus], relaxed
        bonus = int(torch.multinomial(p[len(tokens)], 1, generator=generator))
        return accepted, tokens + [bonus], relaxed


def verifier_from_settings(mode: Verification | str, settings: Mapping[str, Any] | None = None) -> Verifier:
    """The :class:`Verifier` of ``mode`` with its relaxed ``settings`` (the config's ``relaxed``
    group, or a mapping entry's ``relaxed`` block).

    Args:
        mode: ``exact``, ``diversed`` or ``cospec``.
        settings: ``weight`` (DIVERSED's fixed ``w``), ``weight_policy`` (a learned DIVERSED
            weight's JSON; replaces ``weight``), ``policy`` (a learned CoSpec policy's JSON),
            ``tau_draft`` / ``tau_target`` (CoSpec's threshold baseline); a missing key takes
            :class:`~tss_opt.config.schema.RelaxedSettings`' default.

    Raises:
        RelaxedVerificationError: a weight outside [0, 1]; TSSError: a missing or foreign
            policy file, a threshold outside [0, 1].
    """
    from tss_opt.decoding.verify.arbitration import LogisticPolicy
    from tss_opt.decoding.verify.blend_weight import LearnedWeight

    mode = Verification.parse("verification", mode)
    s = dict(settings or {})
    if not mode.lossy:
        return Verifier(mode)
    if mode is Verification.diversed:
        if s.get("weight_policy"):
            return Verifier(mode, weight_policy=LearnedWeight.load(str(s["weight_policy"])))
        return Verifier(mode, weight=check_weight(s.get("weight", RelaxedSettings.weight)))
    if s.get("policy"):
        return Verifier(mode, policy=LogisticPolicy.load(str(s["policy"])))
    return Verifier(mode, policy=ThresholdPolicy(
        float(s.get("tau_draft", RelaxedSettings.tau_draft)), float(s.get("tau_target", RelaxedSettings.tau_target))
    ))


def settings_label(mode: Verification | str, settings: Mapping[str, Any] | None = None) -> str:
    """The rule's label from its settings, without loading anything: ``exact``,
    ``diversed(w=0.6)``, ``diversed(weight_policy=PATH)``, ``cospec(policy=PATH)``,
    ``cospec(tau=0.6,0.15)``. Study protocols and mapping entries carry it."""
    mode = str(Verification.parse("verification", mode))
    s = dict(settings or {})
    if mode == "diversed":
        if s.get("weight_policy"):
            return f"diversed(weight_policy={s['weight_policy']})"
        return f"diversed(w={float(s.get('weight', RelaxedSettings.weight)):.4g})"
    if mode == "cospec":
        if s.get("policy"):
            return f"cospec(policy={s['policy']})"
        tau_draft = float(s.get("tau_draft", RelaxedSettings.tau_draft))
        return f"cospec(tau={tau_draft:.4g},{float(s.get('tau_target', RelaxedSettings.tau_target)):.4g})"
    return mode
