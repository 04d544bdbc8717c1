"""Serving: one loaded target, per-request skip sets from the mapping, domain routing.

- :class:`TSSController` serves requests, picking each request's skip set from the mapping
  file by its domain (labelled, or detected by the router); unknown domains run dense.
- :class:`DomainRouter` detects the domain of an unlabeled request from the target's own
  hidden states (nearest calibration centroid, with a fall-back-to-dense threshold);
  ``router_setup.py`` fits or loads it for a mapping, ``routing_eval.py`` measures it.
- ``chat.py`` formats chat requests; ``server/`` is the OpenAI-compatible HTTP server.

See ``docs/runtime.md``.
"""

from typing import Any

# Each public name and the module that defines it, imported on first use: vLLM imports the
# plugin (runtime/vllm_plugin) in every process it starts, and the controller, the router and
# what they import (decoding, search, metrics) would add seconds to each of them, plain vLLM's
# included (13 s against torch's 2.7 s for `import tss_opt.runtime`, measured on this CPU).
_EXPORTS = {
    "BACKGROUND_PROMPTS": "background",
    "chat_ids": "chat",
    "ControllerResult": "controller",
    "TSSController": "controller",
    "domain_system_prompts": "controller",
    "BACKGROUND": "router",
    "DomainRouter": "router",
    "RouteDecision": "router",
    "RouterError": "router",
    "domains_fingerprint": "router",
    "embed_prompt": "router",
    "load_or_fit_router": "router_setup",
    "router_cache_path": "router_setup",
    "router_domains": "router_setup",
    "RoutingReport": "routing_eval",
    "routing_accuracy": "routing_eval",
}

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


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
