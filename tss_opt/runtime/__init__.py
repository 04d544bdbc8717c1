"""Serving: one loaded target, per-request skip sets from the mapping, domain routing.

- :class:`TSSController` serves requests, picking each request's skip set from the mapping
  file by its domain (labelled, or detected by the router); unknown domains run dense.
- :class:`DomainRouter` detects the domain of an unlabeled request from the target's own
  hidden states (nearest calibration centroid, with a fall-back-to-dense threshold);
  ``router_setup.py`` fits or loads it for a mapping, ``routing_eval.py`` measures it.
- ``chat.py`` formats chat requests; ``server/`` is the OpenAI-compatible HTTP server.

See ``docs/runtime.md``.
"""

from tss_opt.runtime.background import BACKGROUND_PROMPTS
from tss_opt.runtime.chat import chat_ids
from tss_opt.runtime.controller import ControllerResult, TSSController, domain_system_prompts
from tss_opt.runtime.router import (
    BACKGROUND,
    DomainRouter,
    RouteDecision,
    RouterError,
    domains_fingerprint,
    embed_prompt,
)
from tss_opt.runtime.router_setup import load_or_fit_router, router_cache_path, router_domains
from tss_opt.runtime.routing_eval import RoutingReport, routing_accuracy

__all__ = [
    "BACKGROUND",
    "BACKGROUND_PROMPTS",
    "ControllerResult",
    "DomainRouter",
    "RouteDecision",
    "RouterError",
    "RoutingReport",
    "TSSController",
    "chat_ids",
    "domain_system_prompts",
    "domains_fingerprint",
    "embed_prompt",
    "load_or_fit_router",
    "router_cache_path",
    "router_domains",
    "routing_accuracy",
]
