"""What a request asks of the TSS plugin, read from vLLM's per-request ``extra_args``.

A request names its skip set in one of two ways, through ``SamplingParams.extra_args`` (the
OpenAI server fills it from the request's ``vllm_xargs``):

- ``{"tss_domain": "qa"}``: the mapping's entry for the domain (its skip set and the scope it
  was searched with); a domain the mapping lacks runs dense, and says so in the ``tss`` object;
- ``{"tss_skip": [3, 14]}``: an explicit set (scope ``verify`` unless ``tss_scope`` says ``all``).

``tss_scope`` (``verify`` or ``all``) overrides the scope of either. Nothing given: dense,
exactly as plain vLLM. :func:`resolve` checks all of it at admission, in the front-end process,
and raises :class:`TSSArgsError` naming the field, so that a malformed request becomes a 400
(or an exception in ``LLM.generate``) and never reaches the engine core, where an exception
ends the engine. The resolved request travels to the scheduler and the workers as
``extra_args["tss"]`` (:meth:`TSSRequest.to_extra`), so every process sees the skip set the
front end chose, even if the mapping file changes in between.

Imports neither vLLM nor torch: the HTTP middleware and the tests use it as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tss_opt.errors import TSSError
from tss_opt.mapping.format import DEFAULT_SCOPE, SKIP_SCOPES, DomainMapping

__all__ = ["REQUEST_KEYS", "RESOLVED_KEY", "TSSArgsError", "TSSRequest", "resolve", "resolved"]

# The keys a client may send (in vllm_xargs / extra_args), and the one the plugin writes.
DOMAIN_KEY, SKIP_KEY, SCOPE_KEY = "tss_domain", "tss_skip", "tss_scope"
REQUEST_KEYS = (DOMAIN_KEY, SKIP_KEY, SCOPE_KEY)
RESOLVED_KEY = "tss"


class TSSArgsError(TSSError, ValueError):
    """A request's TSS fields are malformed; ``param`` names the field (the 400's ``param``).

    A ``ValueError`` too, so that vLLM's own front end turns it into a 400 where it surfaces.
    """

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class TSSRequest:
    """One request's resolved skip set.

    Attributes:
        domain: The domain the request named (``None``: none).
        skip_set: Layers to bypass, ascending (empty: dense).
        scope: ``verify`` (prompt tokens dense, generated tokens sparse) or ``all``.
        source: ``domain`` (from the mapping), ``explicit`` (``tss_skip``) or ``none``.
        mapped: Whether the mapping has an entry for ``domain``.
    """

    domain: str | None = None
    skip_set: tuple[int, ...] = ()
    scope: str = DEFAULT_SCOPE
    source: str = "none"
    mapped: bool = False

    @property
    def dense(self) -> bool:
        return not self.skip_set

    def cache_salt(self) -> str | None:
        """The prefix-cache salt that keeps this request's cached KV blocks apart from those
        computed under another skip set or scope (``None`` for dense: shared with plain
        requests, whose KV is the same)."""
        if self.dense:
            return None
        return f"tss:{self.scope}:{','.join(map(str, self.skip_set))}"

    def to_extra(self) -> dict[str, Any]:
        """The resolved form carried in ``extra_args[RESOLVED_KEY]`` (plain JSON values)."""
        return {
            "domain": self.domain, "skip": list(self.skip_set), "scope": self.scope,
            "source": self.source, "mapped": self.mapped,
        }

    def info(self) -> dict[str, Any]:
        """The ``tss`` object of a response (the native server's keys where they apply)."""
        return {
            "domain": self.domain, "skip_set": list(self.skip_set), "scope": self.scope,
            "source": self.source, "mapped": self.mapped, "routed": False,
        }


def resolved(extra_args: Mapping[str, Any] | None) -> TSSRequest | None:
    """The request :func:`resolve` wrote into ``extra_args`` (``None``: none was written).

    Read in the scheduler and the workers, where nothing may raise: a value that does not
    have the resolved form (it cannot, unless admission was bypassed) reads as ``None``.
    """
    data = (extra_args or {}).get(RESOLVED_KEY)
    if not isinstance(data, Mapping):
        return None
    try:
        skip = tuple(int(i) for i in data.get("skip") or ())
        scope = str(data.get("scope") or DEFAULT_SCOPE)
    except (TypeError, ValueError):
        return None
    if scope not in SKIP_SCOPES:
        return None
    domain = data.get("domain")
    return TSSRequest(
        domain=None if domain is None else str(domain), skip_set=skip, scope=scope,
        source=str(data.get("source") or "none"), mapped=bool(data.get("mapped")),
    )


def resolve(
    extra_args: Mapping[str, Any] | None, num_layers: int, mapping: DomainMapping | None = None
) -> TSSRequest:
    """Check a request's TSS fields and resolve its skip set.

    Args:
        extra_args: The request's ``SamplingParams.extra_args`` (``vllm_xargs``); keys other
            than ``tss_*`` belong to others and are left alone.
        num_layers: The served model's decoder layer count.
        mapping: The domain-to-skip-set mapping (``None``: no mapping loaded, every domain
            runs dense).

    Raises:
        TSSArgsError: An unknown ``tss_*`` key, a ``tss_skip`` that is not a list of distinct
            layer indices in ``[0, num_layers)``, a ``tss_domain`` that is not a string, or a
            ``tss_scope`` other than ``verify``/``all``.
    """
    args = dict(extra_args or {})
    unknown = sorted(k for k in args if k.startswith("tss_") and k not in REQUEST_KEYS)
    if unknown:
        raise TSSArgsError(
            f"vllm_xargs.{unknown[0]}",
            f"unknown TSS field(s) {unknown} in vllm_xargs; expected {', '.join(REQUEST_KEYS)}",
        )
    scope = _scope(args.get(SCOPE_KEY))
    domain = args.get(DOMAIN_KEY)
    if domain is not None and (not isinstance(domain, str) or not domain.strip()):
        raise TSSArgsError(
            f"vllm_xargs.{DOMAIN_KEY}", f"{DOMAIN_KEY} must be a domain name (a non-empty string), got {domain!r}"
        )
    if args.get(SKIP_KEY) is not None:
        skip = _skip(args[SKIP_KEY], num_layers)
        mapped = bool(mapping and domain and mapping.entry_for(domain))
        return TSSRequest(domain, skip, scope or DEFAULT_SCOPE, "explicit", mapped)
    if domain is None:
        return TSSRequest(scope=scope or DEFAULT_SCOPE)
    entry = mapping.entry_for(domain) if mapping is not None else None
    if entry is None:
        return TSSRequest(domain, (), scope or DEFAULT_SCOPE, "domain", False)
    return TSSRequest(domain, tuple(entry.skip_set), scope or entry.scope, "domain", True)


def _scope(value: Any) -> str | None:
    if value is None:
        return None
    if value not in SKIP_SCOPES:
        raise TSSArgsError(
            f"vllm_xargs.{SCOPE_KEY}", f"{SCOPE_KEY} must be one of {', '.join(SKIP_SCOPES)}, got {value!r}"
        )
    return str(value)


def _skip(value: Any, num_layers: int) -> tuple[int, ...]:
    param = f"vllm_xargs.{SKIP_KEY}"
    if not isinstance(value, list | tuple) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise TSSArgsError(
            param, f"{SKIP_KEY} must be a list of layer indices (integers), e.g. [3, 14]; got {value!r}"
        )
    bad = sorted({i for i in value if not 0 <= i < num_layers})
    if bad:
        raise TSSArgsError(
            param,
            f"{SKIP_KEY} layer(s) {bad} out of range: the served model has {num_layers} decoder layers, "
            f"valid indices are 0..{num_layers - 1}",
        )
    if len(set(value)) != len(value):
        raise TSSArgsError(param, f"{SKIP_KEY} lists a layer twice: {list(value)}; give each layer once")
    return tuple(sorted(value))
