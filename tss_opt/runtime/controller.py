"""The runtime controller: one loaded target serves every domain, each with its own skip set.

For every request the controller resolves a domain (the request's label, or the
:class:`~tss_opt.runtime.router.DomainRouter`'s guess for an unlabeled one), looks the domain's
S* up in the mapping file and runs the whole request through :class:`SpeculativeEngine` with
that skip set, which the engine keeps for the request through the target's one skip mechanism
(``TargetModel.skip``). Nothing is reloaded or copied between requests: switching domains only
changes the set the skip context bypasses. The drafter and its proposals are never changed
(TSS.md, "The mapping and the controller").

Fallbacks, all to the dense target (empty skip set):

- no label and no router, or the router finds no domain close enough;
- a label (or a routed domain) the mapping has no entry for: logged once per domain, since it
  is a normal situation (a new domain that has not been searched yet), not an error.

The mapping is checked against the loaded model when the controller is built: a mapping
searched on another model would skip the wrong layers and is refused.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tss_opt.decoding.drafter import Drafter
from tss_opt.decoding.engine import SCOPES, SpeculativeEngine
from tss_opt.decoding.protocol import DecodeProtocol
from tss_opt.decoding.skip import validate_skip
from tss_opt.decoding.stats import DecodeStats
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.verify.relaxed import Verifier
from tss_opt.evaluation.domains import Example, format_prompt
from tss_opt.mapping import DomainMapping, MappingError, load_mapping
from tss_opt.mapping.rule import entry_verifier
from tss_opt.runtime.background import BACKGROUND_PROMPTS
from tss_opt.runtime.router import DomainRouter, RouteDecision, RouterError, domains_fingerprint

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from tss_opt.assembly import Assembly
    from tss_opt.evaluation.domains import Domain

__all__ = [
    "ControllerResult",
    "TSSController",
    "domain_system_prompts",
    "load_or_fit_router",
    "router_cache_path",
    "router_domains",
]

log = logging.getLogger(__name__)



@dataclass
class ControllerResult:
    """One served request.

    Attributes:
        text: The generated text (special tokens removed).
        tokens: ``torch.LongTensor`` of shape ``(new_tokens,)``: the generated tokens.
        stats: The request's decoding statistics.
        domain: The domain the request was attributed to (its label, or the routed domain);
            ``None`` when it has none (dense).
        skip_set: The layers skipped while verifying (empty: dense).
        routed: Whether ``domain`` came from the router rather than the request's label.
        route: The router's decision for an unlabeled request (``None`` when labelled or
            without a router).
    """

    text: str
    tokens: torch.Tensor
    stats: DecodeStats
    domain: str | None
    skip_set: frozenset[int]
    routed: bool
    route: RouteDecision | None = None

    @property
    def similarity(self) -> float | None:
        """The router's best cosine similarity (``None`` when the router was not asked)."""
        return None if self.route is None else self.route.similarity


class TSSController:
    """Serves requests of any domain on one loaded target, switching skip sets per request.

    Args:
        target: The verifier (loaded once; never copied or reloaded).
        tokenizer: Formats text prompts (chat template when present) and decodes outputs.
        mapping: A :class:`~tss_opt.mapping.DomainMapping`, or the path of a mapping file.
        drafter_factory: Builds a fresh drafter per request, so that online-learning drafters
            (Token Recycling) behave the same whichever request came before; ``None`` results
            mean plain decoding.
        eos_token_ids: Generation stops after any of these.
        router: Detects the domain of unlabeled requests; ``None``: they run dense.
        model_id: The loaded model's id (``LoadedModel.model_id``), compared with the
            mapping's; ``None`` checks the layer count only.
        scope: Skip scope, ``"verify"`` (the paper: dense prefill, sparse verification) or
            ``"all"``.
        temperature: 0 = greedy (lossless with respect to the sparse target).
        max_new_tokens: Default generation length.
        system_prompts: Per domain, the system message its requests get (the domain config's
            ``system_prompt``, as the search formatted its prompts); text requests of other
            domains, and unlabeled ones routed nowhere, get none.
        verification: The acceptance rule: ``"exact"`` (lossless, default) or a relaxed, lossy
            :class:`~tss_opt.decoding.verify.relaxed.Verifier` (DIVERSED, CoSpec);
            every result's ``stats.verification`` / ``stats.lossy`` says which.
        entry_rules: Serve a domain whose mapping entry carries a lossy rule (written by
            ``tune_verification``) under that rule (default), rather than under
            ``verification``. ``False``: every domain under ``verification``.
        protocol: The :class:`~tss_opt.decoding.protocol.DecodeProtocol` (stop tokens, scope,
            temperature, default length, rule) in one value; ``eos_token_ids``, ``scope``,
            ``temperature``, ``max_new_tokens`` and ``verification``, when given, replace its
            fields. Its ``system_prompt`` is unused (``system_prompts`` is per domain).

    Raises:
        MappingError: The mapping file is missing or corrupt, or was searched on another
            model (other id or layer count).
    """

    def __init__(
        self,
        target: TargetModel,
        tokenizer: Any,
        mapping: DomainMapping | str | os.PathLike[str],
        drafter_factory: Callable[[], Drafter | None],
        eos_token_ids: Iterable[int] | None = None,
        router: DomainRouter | None = None,
        *,
        model_id: str | None = None,
        scope: str | None = None,
        temperature: float | None = None,
        max_new_tokens: int | None = None,
        system_prompts: Mapping[str, str | None] | None = None,
        verification: Verifier | str | None = None,
        entry_rules: bool = True,
        protocol: DecodeProtocol | None = None,
    ) -> None:
        # The keyword settings given replace the protocol's (the former arguments keep working).
        given = {
            "eos_token_ids": eos_token_ids, "scope": scope, "temperature": temperature,
            "max_new_tokens": max_new_tokens, "verification": verification,
        }
        protocol = DecodeProtocol.build(protocol, **{k: v for k, v in given.items() if v is not None})
        if protocol.scope not in SCOPES:
            raise ValueError(f"scope={protocol.scope!r} is not a skip scope; expected one of {', '.join(SCOPES)}")
        if not isinstance(mapping, DomainMapping):
            mapping = load_mapping(mapping)
        _check_mapping_model(mapping, model_id, target.num_layers)
        self.target = target
        self.tokenizer = tokenizer
        self.mapping = mapping
        self.drafter_factory = drafter_factory
        self.protocol = protocol
        self.eos_token_ids = protocol.eos_token_ids
        self.router = router
        self.model_id = model_id
        self.scope = protocol.scope
        self.temperature = protocol.temperature
        self.max_new_tokens = protocol.max_new_tokens
        self.system_prompts = {d: p for d, p in (system_prompts or {}).items() if p}
        self.verifier = protocol.verifier
        if self.verifier.lossy:
            log.warning("verification=%s is lossy: outputs may differ from the target's own", self.verifier.describe())
        if not mapping.entries:
            log.warning("the mapping %s has no domains: every request runs dense", mapping.path or "")
        # Validated once here rather than per request: a bad entry fails at start-up.
        self._skip_sets = {d: validate_skip(e.skip_set, target.num_layers) for d, e in mapping.entries.items()}
        # Each lossy entry is served under the rule it was tuned with (rebuilt once, here).
        self._rules: dict[str, Verifier] = {}
        if entry_rules:
            for d, e in mapping.entries.items():
                rule = entry_verifier(e)
                if rule is not None:
                    self._rules[d] = rule
            if self._rules:
                log.warning(
                    "serving lossy rules from the mapping (%s): those domains' outputs may differ from the target's own "
                    "(serve_lossy_entries=false serves them under verification=%s)",
                    ", ".join(f"{d}: {r.describe()}" for d, r in sorted(self._rules.items())), self.verifier.describe(),
                )
        self._reported: set[str] = set()
        # The skip state lives on the model, so two requests must not decode at once.
        self._lock = threading.Lock()

    # ----------------------------------------------------------------------------- lookup
    @property
    def domains(self) -> list[str]:
        """The domains with a skip set in the mapping."""
        return sorted(self._skip_sets)

    def skip_set_for(self, domain: str | None) -> frozenset[int]:
        """The skip set a request of ``domain`` runs with; empty (dense) for no domain or one
        the mapping lacks (logged once per domain)."""
        if domain is None:
            return frozenset()
        skip = self._skip_sets.get(domain)
        if skip is not None:
            return skip
        if domain not in self._reported:
            self._reported.add(domain)
            where = f" {self.mapping.path}" if self.mapping.path else ""
            log.warning(
                "domain %r has no entry in the mapping%s (mapped: %s); its requests run dense. "
                "Run the search for it to get a skip set.",
                domain, where, ", ".join(self.domains) or "none",
            )
        return frozenset()

    def verifier_for(self, domain: str | None) -> Verifier:
        """The acceptance rule a request of ``domain`` is served with: its entry's lossy rule
        (when ``entry_rules``), else the controller's ``verification``."""
        return self._rules.get(domain, self.verifier) if domain is not None else self.verifier

    def resolve(self, prompt_ids: torch.Tensor, domain: str | None) -> tuple[str | None, RouteDecision | None]:
        """The request's domain: its label when given, else the router's decision (``None``:
        no domain). Returns ``(domain, decision)``; ``decision`` is ``None`` unless routed."""
        if domain is not None and str(domain).strip():
            return str(domain).strip(), None
        if self.router is None:
            return None, None
        decision = self.router.route(prompt_ids)
        log.debug(
            "routed to %s (nearest %s, similarity %.3f, threshold %.3f)",
            decision.domain or "dense", decision.nearest, decision.similarity, decision.threshold,
        )
        return decision.domain, decision

    # ----------------------------------------------------------------------------- serving
    def prompt_ids(self, prompt: str | torch.Tensor | Sequence[int], system_prompt: str | None = None) -> torch.Tensor:
        """Token ids of a request: text goes through the chat template (as in the search);
        ids are used as given.

        Returns:
            ``torch.LongTensor`` of shape ``(P,)``.
        """
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("the prompt is empty; give some text")
            return format_prompt(self.tokenizer, Example(id="request", prompt=prompt, references=()), system_prompt)
        ids = torch.as_tensor(prompt, dtype=torch.long).reshape(-1)
        if ids.numel() == 0:
            raise ValueError("the prompt is empty; give at least one token")
        return ids

    def generate(
        self,
        prompt: str | torch.Tensor | Sequence[int],
        domain: str | None = None,
        *,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        system_prompt: str | None = None,
    ) -> ControllerResult:
        """Serve one request with its domain's skip set, kept for the whole request.

        Args:
            prompt: Text (formatted with the chat template) or ``torch.LongTensor`` ids of
                shape ``(P,)``.
            domain: The request's domain label; ``None`` asks the router (if any).
            max_new_tokens: Generation length (default: the controller's).
            temperature: Overrides the controller's temperature.
            seed: Seeds sampling (temperature > 0).
            system_prompt: System message for text prompts; ``None``: the resolved domain's
                (``system_prompts``), if any.
        """
        # The router embeds prompts without a system message (as it was fitted); the domain's
        # own system message is added once the domain is known.
        ids = self.prompt_ids(prompt, system_prompt)
        with self._lock:
            resolved, decision = self.resolve(ids, domain)
            own = self.system_prompts.get(resolved) if resolved is not None else None
            if isinstance(prompt, str) and system_prompt is None and own:
                ids = self.prompt_ids(prompt, own)
            skip = self.skip_set_for(resolved)
            engine = SpeculativeEngine(
                self.target, self.drafter_factory(), eos_token_ids=self.eos_token_ids,
                verification=self.verifier_for(resolved),
            )
            res = engine.generate(
                ids,
                max_new_tokens=int(max_new_tokens or self.max_new_tokens),
                skip=skip,
                scope=self.scope,  # type: ignore[arg-type]
                temperature=self.temperature if temperature is None else float(temperature),
                seed=seed,
            )
        return ControllerResult(
            text=self.tokenizer.decode(res.tokens, skip_special_tokens=True),
            tokens=res.tokens,
            stats=res.stats,
            domain=resolved,
            skip_set=skip,
            routed=decision is not None and decision.domain is not None,
            route=decision,
        )

    # ----------------------------------------------------------------------------- config
    @classmethod
    def from_config(
        cls, cfg: DictConfig, *, runtime: Assembly | None = None, with_router: bool | None = None
    ) -> TSSController:
        """Build the controller the configuration describes (model, drafter, ``mapping_path``).

        Args:
            cfg: The composed configuration (``conf/config.yaml``).
            runtime: An already loaded runtime (default: load ``cfg.model``).
            with_router: Build the domain router; ``None``: only when ``cfg.request_domain``
                is unset (a labelled request does not need one). The router is fitted on the
                calibration prompts of the shipped domains once and cached next to the mapping
                file (``router.<model>.json``).

        Raises:
            MappingError: Missing, corrupt or other-model mapping.
        """
        from tss_opt.assembly import assemble, check_distribution_drafter, serving_protocol

        mapping = load_mapping(cfg.mapping_path)  # fail before loading a model for nothing
        rt = runtime or assemble(cfg)
        _check_mapping_model(mapping, rt.loaded.model_id, rt.target.num_layers)
        drafter = rt.drafter_cfg.get("name")
        searched = sorted({e.drafter for e in mapping.entries.values() if e.drafter})
        if drafter and searched and searched != [drafter]:
            log.warning(
                "serving with drafter %r but the mapping's skip sets were searched with %s; they "
                "may not be the best ones for this drafter (drafter=%s selects it)",
                drafter, ", ".join(searched), searched[0],
            )
        if with_router is None:
            with_router = not cfg.get("request_domain")
        system_prompts = domain_system_prompts(mapping.domains, cfg.get("domain"))
        router = None
        # With no mapped domain every request runs dense: no need to fit a router.
        if with_router and mapping.entries:
            router = load_or_fit_router(rt, router_cache_path(cfg.mapping_path, rt.loaded.model_id), mapping.domains)
        entry_rules = bool(cfg.get("serve_lossy_entries", True))
        for d, e in sorted(mapping.entries.items()):
            if entry_rules and e.lossy:
                check_distribution_drafter(
                    f"{e.verification} (mapping entry {d!r}; serve_lossy_entries=false serves it exact)", rt.drafter_cfg
                )
        return cls(
            rt.target,
            rt.loaded.tokenizer,
            mapping,
            rt.new_drafter,
            router=router,
            model_id=rt.loaded.model_id,
            system_prompts=system_prompts,
            entry_rules=entry_rules,
            protocol=serving_protocol(cfg, rt),
        )


def domain_system_prompts(
    domains: Iterable[str], chosen: Any = None, config_dirs: Sequence[str | os.PathLike[str]] | None = None
) -> dict[str, str | None]:
    """Each domain's ``system_prompt``, read from its config as the search read it.

    Args:
        domains: The mapped domain names.
        chosen: A composed ``+domain=NAME`` config; it wins for its own name.
        config_dirs: Where ``domain/<name>.yaml`` is looked up; ``None``: the shipped
            ``conf/`` and the running command's ``--config-dir`` folders.

    A domain whose config is not found is logged (its requests get no system message).
    """
    from tss_opt.config.search_path import domain_config_dirs
    from tss_opt.evaluation.domains import DomainError, read_domain_config

    dirs = list(config_dirs) if config_dirs is not None else domain_config_dirs()
    chosen_name = chosen.get("name") if chosen is not None else None
    out: dict[str, str | None] = {}
    for name in domains:
        if name == chosen_name:
            out[name] = chosen.get("system_prompt")
            continue
        try:
            out[name] = read_domain_config(name, dirs).system_prompt
        except DomainError as e:
            log.warning(
                "domain %r: no config found (%s); its requests get no system prompt. Pass the "
                "search's --config-dir to apply it.", name, e,
            )
    return out


def _check_mapping_model(mapping: DomainMapping, model_id: str | None, num_layers: int) -> None:
    if model_id is not None:
        mapping.check_model(model_id, num_layers)
    elif mapping.num_layers is not None and mapping.num_layers != num_layers:
        where = f" {mapping.path}" if mapping.path else ""
        raise MappingError(
            f"The mapping{where} is for model '{mapping.model}' ({mapping.num_layers} layers), but "
            f"the target has {num_layers} layers; its skip sets would skip the wrong layers. Use "
            "the mapping file searched on this model or run the search for it."
        )


# --------------------------------------------------------------------------------- router
def router_cache_path(mapping_path: str | os.PathLike[str], model_id: str) -> Path:
    """Where the fitted router of ``model_id`` is kept: next to the mapping file."""
    slug = re.sub(r"[^A-Za-z0-9]+", "_", model_id).strip("_").lower() or "model"
    return Path(mapping_path).with_name(f"router.{slug}.json")


def router_domains(extra: Iterable[str] = (), config_dirs: Sequence[str | os.PathLike[str]] | None = None) -> list[Domain]:
    """The domains of the config folders (``<dir>/domain/*.yaml``) plus ``extra`` names found
    there.

    Fitting on every known domain, mapped or not, keeps a prompt that resembles an unmapped
    domain from being pushed into a mapped one.

    Args:
        extra: Names that must be included (the mapped domains).
        config_dirs: Where domain configs are looked up; ``None``: the shipped ``conf/`` and
            the running command's ``--config-dir`` folders.
    """
    from tss_opt.config.search_path import domain_config_dirs
    from tss_opt.evaluation.domains import (
        DomainError,
        available_domains,
        load_domain,
        read_domain_config,
    )

    dirs = list(config_dirs) if config_dirs is not None else domain_config_dirs()
    names = sorted(set(available_domains(dirs)) | set(extra))
    out = []
    for name in names:
        try:
            out.append(load_domain(read_domain_config(name, dirs)))
        except DomainError as e:
            log.warning("router: domain %r left out (%s)", name, e)
    return out


def load_or_fit_router(rt: Assembly, path: Path, extra_domains: Iterable[str] = ()) -> DomainRouter:
    """The cached router at ``path`` if it matches the model and the domains' prompts, else a
    new one fitted on the domains' calibration prompts (one dense forward each) and saved."""
    domains = router_domains(extra_domains)
    if not domains:
        raise RouterError("no domain configs found to fit the router on; add conf/domain/*.yaml or pass request_domain=...")
    model_id = rt.loaded.model_id
    if path.is_file():
        try:
            router = DomainRouter.load(path, rt.target, model_id=model_id)
            if router.fingerprint == domains_fingerprint(domains, "calibration", BACKGROUND_PROMPTS):
                log.info("router: loaded %s (%s)", path, ", ".join(router.domains))
                return router
            log.info("router: %s was fitted on other prompts; refitting", path)
        except RouterError as e:
            log.warning("router: %s; refitting", e)
    log.info("router: fitting on the calibration prompts of %s", ", ".join(d.name for d in domains))
    router = DomainRouter.fit_domains(rt.target, rt.loaded.tokenizer, domains, model_id=model_id)
    router.save(path)
    log.info("router: saved %s", path)
    return router
