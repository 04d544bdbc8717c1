"""Domain detection for unlabeled requests: nearest domain centroid in the target's own space.

A prompt is embedded as the mean, over its tokens, of the target's final hidden states (the
decoder output after the final norm), computed densely on its first ``max_tokens`` tokens.
Tokens of the prefix every fitting prompt shares (the chat template's opening, its default
system prompt) are left out of the mean: under causal attention their hidden states are the
same for every prompt and carry no information about it.

Fitting embeds each domain's calibration prompts plus a *background* set of generic requests
(:mod:`tss_opt.runtime.background`), standardises every dimension (mean 0, standard deviation
1 over those embeddings: a few very large hidden-state dimensions would otherwise dominate the
cosine) and keeps the normalised mean of each class as its centroid. A request goes to the
class of highest cosine similarity. It runs dense (``domain=None``) when that class is the
background, or when the similarity is below the domain's threshold; by default each domain's
threshold is ``margin`` times the lowest leave-one-out similarity of its calibration prompts
to their own centroid (domains differ widely in spread: translation prompts are near copies of
each other, RAG prompts are not).

Measured choices (SmolLM2-135M, 5 domains, 64 held-out prompts each; docs/runtime.md):
standardising raised nearest-centroid accuracy from 0.88 to 0.95; the background class sends
all eight far-away chat, code and SQL prompts of the benchmark to dense, which no single
threshold did (they look like short QA questions); cutting long prompts to head + tail tokens
instead of the first 256 did not help (RAG prompts still look like summarization).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tss_opt.errors import TSSError

if TYPE_CHECKING:
    from tss_opt.decoding.target import TargetModel
    from tss_opt.evaluation.domains import Domain

__all__ = [
    "BACKGROUND",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_THRESHOLD_MARGIN",
    "DomainRouter",
    "RouteDecision",
    "RouterError",
    "decide",
    "domains_fingerprint",
    "embed_prompt",
]

log = logging.getLogger(__name__)

# Embedding a prompt costs one dense forward over it; the first tokens carry the instruction
# ("Summarize:", "Translate German to English:", the question), so longer prompts are cut.
DEFAULT_MAX_TOKENS = 256
DEFAULT_THRESHOLD_MARGIN = 0.8
# The class of generic requests: routed there means "no domain", i.e. dense.
BACKGROUND = "<background>"
ROUTER_FORMAT = 2


class RouterError(TSSError):
    """A router cannot be built or loaded; the message names the value and the fix."""


@dataclass(frozen=True)
class RouteDecision:
    """Where one request was routed.

    Attributes:
        domain: The routed domain, or ``None`` (dense): nearest class is the background, or
            the similarity is below the nearest domain's threshold.
        similarity: Cosine similarity to the nearest class's centroid.
        nearest: The nearest class (a domain or :data:`BACKGROUND`), even when not routed.
        threshold: The nearest domain's threshold (``nan`` for the background).
        scores: Similarity to every class's centroid.
    """

    domain: str | None
    similarity: float
    nearest: str
    threshold: float = math.nan
    scores: Mapping[str, float] = field(default_factory=dict)


def _unit(x: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit L2 norm; ``x`` of shape ``(..., H)``."""
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


@torch.inference_mode()
def embed_prompt(
    target: TargetModel,
    prompt_ids: torch.Tensor | Sequence[int],
    max_tokens: int = DEFAULT_MAX_TOKENS,
    skip_prefix: int = 0,
) -> torch.Tensor:
    """Mean-pooled final hidden state of the dense target over a prompt.

    Args:
        target: The loaded target; the forward runs under an empty skip set (dense), also
            when called inside a request's skip context.
        prompt_ids: ``torch.LongTensor`` of shape ``(P,)``.
        max_tokens: Only the first ``max_tokens`` tokens are run.
        skip_prefix: Leading positions left out of the mean (at least one position is kept).

    Returns:
        ``torch.FloatTensor`` of shape ``(hidden,)`` (float32, on CPU).
    """
    ids = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1)[:max_tokens]
    if ids.numel() == 0:
        raise RouterError("cannot route an empty prompt; give at least one token")
    with target.skip(()):
        out = target.decoder(input_ids=ids.to(target.device).unsqueeze(0), use_cache=False)
    hidden = out.last_hidden_state[0].float()  # [P, H]
    start = min(skip_prefix, hidden.shape[0] - 1)
    return hidden[start:].mean(0).cpu()  # [H]


def _common_prefix(seqs: Sequence[torch.Tensor]) -> list[int]:
    """Longest token prefix shared by every sequence."""
    first = seqs[0].tolist()
    n = min(len(s) for s in seqs)
    k = 0
    while k < n and all(int(s[k]) == first[k] for s in seqs):
        k += 1
    return first[:k]


class DomainRouter:
    """Routes a prompt to the domain whose calibration prompts it resembles most.

    Build it with :meth:`fit` (or :meth:`fit_domains`), or :meth:`load` a saved one.

    Args:
        target: The target whose hidden states embed prompts.
        centroids: Per class (domains and optionally :data:`BACKGROUND`),
            ``torch.FloatTensor`` of shape ``(hidden,)`` in the standardised space.
        center, scale: ``torch.FloatTensor`` of shape ``(hidden,)``: embeddings are mapped to
            ``(e - center) / scale`` before the cosine.
        thresholds: Per domain, the minimum cosine similarity for routing there; a single
            float applies to every domain.
        prefix_ids: Token prefix left out of the mean when a prompt starts with it.
        max_tokens: Prompt tokens embedded.
        model_id: The model the router was fitted on (checked by :meth:`load`).
        fingerprint: Identifies the prompts it was fitted on (see :func:`domains_fingerprint`).
    """

    def __init__(
        self,
        target: TargetModel,
        centroids: Mapping[str, torch.Tensor],
        center: torch.Tensor,
        scale: torch.Tensor,
        thresholds: Mapping[str, float] | float,
        *,
        prefix_ids: Sequence[int] = (),
        max_tokens: int = DEFAULT_MAX_TOKENS,
        model_id: str | None = None,
        fingerprint: str | None = None,
    ) -> None:
        self.domains = sorted(d for d in centroids if d != BACKGROUND)
        if not self.domains:
            raise RouterError("a router needs at least one domain; fit it on the domains' calibration prompts")
        hidden = int(center.numel())
        bad = {d: tuple(c.shape) for d, c in centroids.items() if tuple(c.shape) != (hidden,)}
        if bad or tuple(scale.shape) != (hidden,):
            raise RouterError(f"centroid shapes {bad or tuple(scale.shape)} do not match the hidden size {hidden}; refit the router on this model")
        if isinstance(thresholds, (int, float)):
            thresholds = dict.fromkeys(self.domains, float(thresholds))
        missing = [d for d in self.domains if d not in thresholds]
        if missing:
            raise RouterError(f"no threshold for domain(s) {', '.join(missing)}; give one per domain or a single float")
        self.target = target
        self.classes = [*self.domains, *([BACKGROUND] if BACKGROUND in centroids else [])]
        self.centroids = torch.stack([_unit(centroids[c].float()) for c in self.classes])  # [C, H]
        self.center = center.float()
        self.scale = scale.float().clamp_min(1e-6)
        self.thresholds = {d: float(thresholds[d]) for d in self.domains}
        self.prefix_ids = [int(t) for t in prefix_ids]
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
        background: Sequence[torch.Tensor] = (),
        threshold: float | Mapping[str, float] | None = None,
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
            background: Prompts of requests that belong to no domain (same format); their
                class competes with the domains and routes to dense. Empty: no such class.
            threshold: Fixed similarity threshold(s); ``None`` calibrates one per domain:
                ``margin`` times the lowest leave-one-out similarity of a fitting prompt to
                its own domain's centroid (0 for a domain with a single prompt).
            margin: See ``threshold``.
            max_tokens: Prompt tokens embedded.
            model_id: Recorded for :meth:`load`'s check.
            fingerprint: Recorded to tell later whether the fitting prompts changed.
        """
        empty = [d for d, p in prompts.items() if not p]
        if not prompts or empty:
            raise RouterError(f"every domain needs at least one prompt to fit the router; empty: {empty or 'all'}")
        if BACKGROUND in prompts:
            raise RouterError(f"{BACKGROUND!r} is reserved for the background class; pass those prompts as background=")
        every = [torch.as_tensor(p).reshape(-1) for ps in prompts.values() for p in ps] + [
            torch.as_tensor(p).reshape(-1) for p in background
        ]
        prefix = _common_prefix(every)
        classes = {**prompts, **({BACKGROUND: background} if background else {})}
        raw = {
            c: torch.stack([embed_prompt(target, p, max_tokens, len(prefix)) for p in ps]) for c, ps in classes.items()
        }  # [n_c, H]
        stacked = torch.cat(list(raw.values()))
        center = stacked.mean(0)
        # One prompt in all: nothing to standardise against.
        scale = stacked.std(0).clamp_min(1e-6) if stacked.shape[0] > 1 else torch.ones_like(center)
        units = {c: _unit((e - center) / scale) for c, e in raw.items()}
        centroids = {c: _unit(u.mean(0)) for c, u in units.items()}
        if threshold is None:
            thresholds: Mapping[str, float] | float = {
                d: margin * _lowest_own_similarity(units[d]) for d in prompts
            }
            log.info("router: calibrated thresholds %s", {d: round(t, 3) for d, t in thresholds.items()})
        else:
            thresholds = threshold
        return cls(
            target, centroids, center, scale, thresholds, prefix_ids=prefix, max_tokens=max_tokens,
            model_id=model_id, fingerprint=fingerprint,
        )

    @classmethod
    def fit_domains(
        cls,
        target: TargetModel,
        tokenizer: Any,
        domains: Sequence[Domain],
        *,
        split: str = "calibration",
        background: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> DomainRouter:
        """:meth:`fit` on each domain's ``split`` (the calibration prompts by default).

        Prompts are formatted without the domain's system prompt: an unlabeled request does
        not carry one either.

        Args:
            background: Texts of generic requests; ``None``: the built-in
                :data:`~tss_opt.runtime.background.BACKGROUND_PROMPTS`; ``()``: none.
        """
        from tss_opt.evaluation.domains import Example, format_prompt
        from tss_opt.runtime.background import BACKGROUND_PROMPTS

        texts = BACKGROUND_PROMPTS if background is None else tuple(background)
        prompts = {d.name: [format_prompt(tokenizer, ex, None) for ex in d.split(split)] for d in domains}  # type: ignore[arg-type]
        bg = [format_prompt(tokenizer, Example(id=f"bg{i}", prompt=t, references=()), None) for i, t in enumerate(texts)]
        kwargs.setdefault("fingerprint", domains_fingerprint(domains, split, texts))
        return cls.fit(target, prompts, background=bg, **kwargs)

    # ----------------------------------------------------------------------------- routing
    def embed(self, prompt_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """A prompt in the router's space: ``torch.FloatTensor`` of shape ``(hidden,)``,
        standardised and of unit norm."""
        ids = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1)
        k = len(self.prefix_ids)
        skip = k if k and ids.numel() > k and ids[:k].tolist() == self.prefix_ids else 0
        e = embed_prompt(self.target, ids, self.max_tokens, skip)
        return _unit((e - self.center) / self.scale)

    def scores(self, prompt_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """Cosine similarity to each class (``torch.FloatTensor`` of shape ``(C,)``, in
        :attr:`classes` order)."""
        return self.centroids @ self.embed(prompt_ids)  # [C, H] @ [H] -> [C]

    def route(self, prompt_ids: torch.Tensor | Sequence[int]) -> RouteDecision:
        """The domain of a request, or ``None`` (dense).

        Args:
            prompt_ids: ``torch.LongTensor`` of shape ``(P,)``, formatted as for generation.
        """
        s = self.scores(prompt_ids)
        return replace(decide(self, s), scores={c: float(v) for c, v in zip(self.classes, s, strict=True)})

    # ----------------------------------------------------------------------------- storage
    def to_data(self) -> dict[str, Any]:
        """A JSON-ready description (vectors as lists)."""
        return {
            "format": ROUTER_FORMAT,
            "model_id": self.model_id,
            "fingerprint": self.fingerprint,
            "max_tokens": self.max_tokens,
            "prefix_ids": self.prefix_ids,
            "thresholds": self.thresholds,
            "center": self.center.tolist(),
            "scale": self.scale.tolist(),
            "centroids": {c: v.tolist() for c, v in zip(self.classes, self.centroids, strict=True)},
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the router as JSON (a few kB per class); returns the path."""
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
            RouterError: The file is missing, corrupt or of another format version, or was
                fitted on another model (``model_id`` differs, or the hidden size does not
                match).
        """
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != ROUTER_FORMAT:
                raise ValueError(f"format {data.get('format')!r}, this code reads {ROUTER_FORMAT}")
            center = torch.tensor(data["center"], dtype=torch.float32)
            scale = torch.tensor(data["scale"], dtype=torch.float32)
            centroids = {str(c): torch.tensor(v, dtype=torch.float32) for c, v in data["centroids"].items()}
            thresholds = {str(d): float(t) for d, t in data["thresholds"].items()}
            prefix = [int(t) for t in data.get("prefix_ids", [])]
            max_tokens = int(data.get("max_tokens", DEFAULT_MAX_TOKENS))
            stored_model = data.get("model_id")
            fingerprint = data.get("fingerprint")
        except FileNotFoundError as e:
            raise RouterError(f"router file {path} does not exist; fit the router (DomainRouter.fit_domains) and save it") from e
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise RouterError(f"router file {path} is corrupt or outdated ({type(e).__name__}: {e}); delete it to refit") from e
        if model_id is not None and stored_model is not None and stored_model != model_id:
            raise RouterError(
                f"router file {path} was fitted on model {stored_model!r}, not the loaded {model_id!r}; "
                "delete it to refit on this model"
            )
        hidden = int(target.model.config.hidden_size)
        if center.numel() != hidden:
            raise RouterError(f"router file {path} has vectors of size {center.numel()} but the model's hidden size is {hidden}; delete it to refit")
        return cls(
            target, centroids, center, scale, thresholds, prefix_ids=prefix, max_tokens=max_tokens,
            model_id=stored_model, fingerprint=fingerprint,
        )


def domains_fingerprint(domains: Sequence[Domain], split: str = "calibration", background: Sequence[str] = ()) -> str:
    """A short hash of the domains' names, the ids of their ``split`` prompts and the
    background texts: a cached router fitted on other prompts is refitted."""
    data = {
        "domains": {d.name: [ex.id for ex in d.split(split)] for d in domains},  # type: ignore[arg-type]
        "background": list(background),
    }
    return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def _lowest_own_similarity(units: torch.Tensor) -> float:
    """Lowest cosine similarity of a prompt to its domain's centroid computed without it
    (leave-one-out: in-sample similarities are optimistic); 0 for a single prompt.

    Args:
        units: Unit embeddings of one domain, shape ``(n, H)``.
    """
    n = units.shape[0]
    if n < 2:
        return 0.0
    loo = _unit((units.sum(0, keepdim=True) - units) / (n - 1))  # [n, H]
    return float((loo * units).sum(-1).min())


def decide(router: DomainRouter, scores: torch.Tensor) -> RouteDecision:
    """The decision for class similarities ``scores`` of shape ``(C,)``: the nearest class,
    unless it is the background or below its domain's threshold."""
    best = int(torch.argmax(scores))
    nearest = router.classes[best]
    sim = float(scores[best])
    thr = router.thresholds.get(nearest, math.nan)
    return RouteDecision(nearest if nearest != BACKGROUND and sim >= thr else None, sim, nearest, thr)
