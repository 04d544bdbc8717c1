"""Domain detection for unlabeled requests: nearest domain centroid in the target's own space.

A prompt is embedded as the mean over its tokens of the target's final hidden states (the
decoder output, after the final norm), computed densely. Embeddings are centred on the mean of
all calibration embeddings (what every prompt shares, such as the chat template and the default
system prompt, would otherwise dominate the cosine) and L2-normalised; each domain keeps the
normalised mean of its calibration prompts as its centroid. A request goes to the domain whose
centroid has the highest cosine similarity, or to no domain (the dense path) when even that
similarity is below ``threshold``.

No extra package and no second model: the router reuses the loaded target, and a fitted router
is a few kilobytes (one vector per domain) that :meth:`DomainRouter.save` keeps for later runs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from tss_opt.evaluation.decoding.target import TargetModel
    from tss_opt.evaluation.domains import Domain

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DomainRouter",
    "RouteDecision",
    "RouterError",
    "RoutingReport",
    "domains_fingerprint",
    "embed_prompt",
    "routing_accuracy",
]

log = logging.getLogger(__name__)

# Embedding a prompt costs one dense forward over it; the first tokens carry the instruction
# ("Summarize:", "Translate German to English:", the question), so longer prompts are cut.
DEFAULT_MAX_TOKENS = 256
# The default threshold is this fraction of the lowest leave-one-out similarity of a
# calibration prompt to its own domain (see ``DomainRouter.fit``).
DEFAULT_THRESHOLD_MARGIN = 0.8
ROUTER_FORMAT = 1


class RouterError(ValueError):
    """A router cannot be built or loaded; the message names the value and the fix."""


@dataclass(frozen=True)
class RouteDecision:
    """Where one request was routed.

    Attributes:
        domain: The nearest domain, or ``None`` when its similarity is below the threshold.
        similarity: Cosine similarity to the nearest domain's centroid.
        nearest: The nearest domain even when below the threshold (for logs).
        scores: Similarity to every domain's centroid.
    """

    domain: str | None
    similarity: float
    nearest: str
    scores: Mapping[str, float] = field(default_factory=dict)


@torch.inference_mode()
def embed_prompt(target: TargetModel, prompt_ids: torch.Tensor | Sequence[int], max_tokens: int = DEFAULT_MAX_TOKENS) -> torch.Tensor:
    """Mean-pooled final hidden state of the dense target over the prompt.

    Args:
        target: The loaded target; the forward runs under an empty skip set (dense), also
            when called inside a request's skip context.
        prompt_ids: ``torch.LongTensor`` of shape ``(P,)``.
        max_tokens: Only the first ``max_tokens`` tokens are embedded.

    Returns:
        ``torch.FloatTensor`` of shape ``(hidden,)`` (float32, on CPU).
    """
    ids = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1)[:max_tokens]
    if ids.numel() == 0:
        raise RouterError("cannot route an empty prompt; give at least one token")
    with target.skip(()):
        out = target.decoder(input_ids=ids.to(target.device).unsqueeze(0), use_cache=False)
    return out.last_hidden_state[0].float().mean(0).cpu()  # [P, H] -> [H]


def _unit(x: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit L2 norm; ``x`` of shape ``(..., H)``."""
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


class DomainRouter:
    """Routes a prompt to the domain whose calibration prompts it resembles most.

    Build it with :meth:`fit` (or :meth:`fit_domains`), or :meth:`load` a saved one.

    Args:
        target: The target whose hidden states embed prompts.
        centroids: Per domain, ``torch.FloatTensor`` of shape ``(hidden,)`` (unit norm, in the
            centred space).
        center: ``torch.FloatTensor`` of shape ``(hidden,)`` subtracted before normalising.
        threshold: Minimum cosine similarity for a routed domain; below it, ``None``.
        max_tokens: Prompt tokens embedded.
        model_id: The model the router was fitted on (checked by :meth:`load`).
        fingerprint: Identifies the prompts it was fitted on (see :func:`domains_fingerprint`).
    """

    def __init__(
        self,
        target: TargetModel,
        centroids: Mapping[str, torch.Tensor],
        center: torch.Tensor,
        threshold: float,
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        model_id: str | None = None,
        fingerprint: str | None = None,
    ) -> None:
        if not centroids:
            raise RouterError("a router needs at least one domain; fit it on the domains' calibration prompts")
        hidden = int(center.numel())
        bad = {d: tuple(c.shape) for d, c in centroids.items() if tuple(c.shape) != (hidden,)}
        if bad:
            raise RouterError(f"centroid shapes {bad} do not match the hidden size {hidden}; refit the router on this model")
        self.target = target
        self.domains = sorted(centroids)
        self.centroids = torch.stack([_unit(centroids[d].float()) for d in self.domains])  # [D, H]
        self.center = center.float()
        self.threshold = float(threshold)
        self.max_tokens = int(max_tokens)
        self.model_id = model_id
        self.fingerprint = fingerprint

    # ----------------------------------------------------------------------------- fitting
    @classmethod
    def fit(
        cls,
        target: TargetModel,
        prompts: Mapping[str, Sequence[torch.Tensor]],
        *,
        threshold: float | None = None,
        margin: float = DEFAULT_THRESHOLD_MARGIN,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        model_id: str | None = None,
        fingerprint: str | None = None,
    ) -> DomainRouter:
        """Embed each domain's prompts and keep one centroid per domain.

        Args:
            target: The target model.
            prompts: Per domain, prompt ids (``torch.LongTensor`` of shape ``(P,)`` each),
                formatted as requests will be (chat template included).
            threshold: Fixed similarity threshold; ``None`` calibrates it: ``margin`` times the
                lowest leave-one-out similarity of a fitting prompt to its own domain's
                centroid, so that every calibration prompt would still be routed while prompts
                unlike every domain (which score near 0 after centring) fall back to dense.
            margin: See ``threshold``.
            max_tokens: Prompt tokens embedded.
            model_id: Recorded for :meth:`load`'s check.
            fingerprint: Recorded to tell later whether the fitting prompts changed.
        """
        empty = [d for d, p in prompts.items() if not p]
        if not prompts or empty:
            raise RouterError(f"every domain needs at least one prompt to fit the router; empty: {empty or 'all'}")
        raw = {d: torch.stack([embed_prompt(target, p, max_tokens) for p in ps]) for d, ps in prompts.items()}  # [n_d, H]
        center = torch.cat(list(raw.values())).mean(0)
        units = {d: _unit(e - center) for d, e in raw.items()}
        centroids = {d: _unit(u.mean(0)) for d, u in units.items()}
        if threshold is None:
            threshold = margin * _lowest_own_similarity(units)
            log.info("router: calibrated threshold %.3f (margin %.2f)", threshold, margin)
        return cls(
            target, centroids, center, threshold, max_tokens=max_tokens, model_id=model_id, fingerprint=fingerprint
        )

    @classmethod
    def fit_domains(
        cls,
        target: TargetModel,
        tokenizer: Any,
        domains: Sequence[Domain],
        *,
        split: str = "calibration",
        **kwargs: Any,
    ) -> DomainRouter:
        """:meth:`fit` on each domain's ``split`` (the calibration prompts by default).

        Prompts are formatted without the domain's system prompt: an unlabeled request does
        not carry one either.
        """
        from tss_opt.evaluation.domains import format_prompt

        prompts = {d.name: [format_prompt(tokenizer, ex, None) for ex in d.split(split)] for d in domains}  # type: ignore[arg-type]
        kwargs.setdefault("fingerprint", domains_fingerprint(domains, split))
        return cls.fit(target, prompts, **kwargs)

    # ----------------------------------------------------------------------------- routing
    def scores(self, prompt_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """Cosine similarity to each domain (``torch.FloatTensor`` of shape ``(D,)``, in
        :attr:`domains` order)."""
        e = _unit(embed_prompt(self.target, prompt_ids, self.max_tokens) - self.center)
        return self.centroids @ e  # [D, H] @ [H] -> [D]

    def route(self, prompt_ids: torch.Tensor | Sequence[int]) -> RouteDecision:
        """The domain of a request, or ``None`` (dense) below the threshold.

        Args:
            prompt_ids: ``torch.LongTensor`` of shape ``(P,)``, formatted as for generation.
        """
        s = self.scores(prompt_ids)
        best = int(torch.argmax(s))
        sim = float(s[best])
        nearest = self.domains[best]
        return RouteDecision(
            domain=nearest if sim >= self.threshold else None,
            similarity=sim,
            nearest=nearest,
            scores={d: float(v) for d, v in zip(self.domains, s, strict=True)},
        )

    # ----------------------------------------------------------------------------- storage
    def to_data(self) -> dict[str, Any]:
        """A JSON-ready description (vectors as lists)."""
        return {
            "format": ROUTER_FORMAT,
            "model_id": self.model_id,
            "fingerprint": self.fingerprint,
            "threshold": self.threshold,
            "max_tokens": self.max_tokens,
            "center": self.center.tolist(),
            "centroids": {d: c.tolist() for d, c in zip(self.domains, self.centroids, strict=True)},
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the router as JSON (a few kB per domain); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_data()), encoding="utf-8")
        os.replace(tmp, path)  # readers never see half a file
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str], target: TargetModel, *, model_id: str | None = None) -> DomainRouter:
        """Read a router written by :meth:`save`.

        Raises:
            RouterError: The file is missing or corrupt, or was fitted on another model
                (``model_id`` differs, or the hidden size does not match).
        """
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            center = torch.tensor(data["center"], dtype=torch.float32)
            centroids = {str(d): torch.tensor(c, dtype=torch.float32) for d, c in data["centroids"].items()}
            threshold = float(data["threshold"])
            max_tokens = int(data.get("max_tokens", DEFAULT_MAX_TOKENS))
            stored_model = data.get("model_id")
            fingerprint = data.get("fingerprint")
        except FileNotFoundError as e:
            raise RouterError(f"router file {path} does not exist; fit the router (DomainRouter.fit_domains) and save it") from e
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise RouterError(f"router file {path} is corrupt ({type(e).__name__}: {e}); delete it to refit") from e
        if model_id is not None and stored_model is not None and stored_model != model_id:
            raise RouterError(
                f"router file {path} was fitted on model {stored_model!r}, not the loaded {model_id!r}; "
                "delete it to refit on this model"
            )
        hidden = int(target.model.config.hidden_size)
        if center.numel() != hidden:
            raise RouterError(f"router file {path} has vectors of size {center.numel()} but the model's hidden size is {hidden}; delete it to refit")
        return cls(
            target, centroids, center, threshold, max_tokens=max_tokens, model_id=stored_model, fingerprint=fingerprint
        )


def domains_fingerprint(domains: Sequence[Domain], split: str = "calibration") -> str:
    """A short hash of the domains' names and the ids of their ``split`` prompts."""
    data = {d.name: [ex.id for ex in d.split(split)] for d in domains}  # type: ignore[arg-type]
    return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def _lowest_own_similarity(units: Mapping[str, torch.Tensor]) -> float:
    """Lowest cosine similarity of a fitting prompt to its own domain's centroid, that centroid
    computed without the prompt (leave-one-out: in-sample similarities are optimistic).

    Args:
        units: Per domain, unit embeddings of shape ``(n_d, H)``.
    """
    lowest = math.inf
    for u in units.values():
        n = u.shape[0]
        if n < 2:
            continue  # no centroid without the only prompt
        loo = _unit((u.sum(0, keepdim=True) - u) / (n - 1))  # [n, H]
        lowest = min(lowest, float((loo * u).sum(-1).min()))
    if not math.isfinite(lowest):
        return 0.0  # one prompt per domain: route everything to the nearest domain
    return lowest


@dataclass
class RoutingReport:
    """Routing accuracy on labelled prompts.

    Attributes:
        accuracy: Fraction routed to their own domain (fallbacks count as errors).
        per_domain: Accuracy per true domain.
        fallback_rate: Fraction routed to no domain (dense).
        confusion: ``confusion[true][routed]`` counts; ``routed`` is ``"dense"`` for fallbacks.
        nearest_accuracy: Accuracy when the threshold is ignored (always the nearest domain).
        total: Prompts routed.
        threshold: The router's threshold.
    """

    accuracy: float
    per_domain: dict[str, float]
    fallback_rate: float
    confusion: dict[str, dict[str, int]]
    nearest_accuracy: float
    total: int
    threshold: float

    def to_markdown(self) -> str:
        """The confusion matrix as a Markdown table (rows: true domain)."""
        cols = sorted({c for row in self.confusion.values() for c in row} - {"dense"}) + ["dense"]
        lines = [
            f"Routing accuracy {self.accuracy:.3f} on {self.total} prompts (nearest domain, no threshold: "
            f"{self.nearest_accuracy:.3f}; fell back to dense: {self.fallback_rate:.3f}; threshold {self.threshold:.3f})",
            "",
            "| true \\ routed | " + " | ".join(cols) + " | accuracy |",
            "|---|" + "---:|" * (len(cols) + 1),
        ]
        for true in sorted(self.confusion):
            row = self.confusion[true]
            cells = " | ".join(str(row.get(c, 0)) for c in cols)
            lines.append(f"| {true} | {cells} | {self.per_domain[true]:.3f} |")
        return "\n".join(lines)


def routing_accuracy(
    router: DomainRouter,
    tokenizer: Any,
    domains: Sequence[Domain],
    *,
    split: str = "heldout",
    limit: int | None = None,
    progress: bool = True,
) -> RoutingReport:
    """Route each labelled prompt of ``domains``' ``split`` and count how many land home.

    Args:
        router: A fitted router.
        tokenizer: Formats prompts as requests are formatted (chat template).
        domains: The labelled domains (the shipped five by default in the benchmark).
        split: Which split to route (``heldout``: disjoint from the calibration prompts the
            router was fitted on).
        limit: Prompts per domain (``None``: all).
        progress: Log one line per domain.
    """
    from tss_opt.evaluation.domains import format_prompt

    confusion: dict[str, dict[str, int]] = {}
    hits = nearest_hits = fallbacks = total = 0
    for d in domains:
        examples = d.split(split)  # type: ignore[arg-type]
        if limit is not None:
            examples = examples[:limit]
        row: dict[str, int] = {}
        for ex in examples:
            dec = router.route(format_prompt(tokenizer, ex, None))
            key = dec.domain or "dense"
            row[key] = row.get(key, 0) + 1
            hits += dec.domain == d.name
            nearest_hits += dec.nearest == d.name
            fallbacks += dec.domain is None
            total += 1
        confusion[d.name] = row
        if progress:
            n = max(1, len(examples))
            log.info("routing %s: %d/%d routed home", d.name, row.get(d.name, 0), n)
    if total == 0:
        raise RouterError(f"no prompts to route in split {split!r}")
    return RoutingReport(
        accuracy=hits / total,
        per_domain={d: confusion[d].get(d, 0) / max(1, sum(confusion[d].values())) for d in confusion},
        fallback_rate=fallbacks / total,
        confusion=confusion,
        nearest_accuracy=nearest_hits / total,
        total=total,
        threshold=router.threshold,
    )
