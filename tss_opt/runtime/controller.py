"""The runtime controller: one loaded target serves every domain, each with its own skip set.

For every request the controller resolves a domain (the request's label, or the
:class:`~tss_opt.runtime.router.DomainRouter`'s guess for an unlabeled one), looks the domain's
S* up in the mapping file and runs the whole request through :class:`SpeculativeEngine` with
that skip set and the entry's skip scope (``verify``: dense prefill; ``all``: sparse prefill
too, as the search measured it), which the engine keeps for the request through the target's one skip mechanism
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
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tss_opt.decoding.batch import BatchEngine, Row
from tss_opt.decoding.batch_budget import DepthPolicy
from tss_opt.decoding.drafter import Drafter
from tss_opt.decoding.engine import SCOPES, StepHook
from tss_opt.decoding.protocol import DecodeProtocol
from tss_opt.decoding.skip import validate_skip
from tss_opt.decoding.stats import DecodeStats
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.verify.relaxed import Verifier
from tss_opt.evaluation.domains import Example, format_prompt
from tss_opt.mapping import DomainMapping, MappingError, load_mapping
from tss_opt.mapping.rule import entry_verifier
from tss_opt.runtime.chat import chat_ids, has_system, is_chat
from tss_opt.runtime.router import DomainRouter, RouteDecision

if TYPE_CHECKING:
    from tss_opt.config.domain import DomainConfig

__all__ = [
    "Admission",
    "ControllerResult",
    "TSSController",
    "check_mapping_model",
    "domain_system_prompts",
]

log = logging.getLogger(__name__)

# Unmapped domain names logged at most (one line each); a client picks them.
MAX_REPORTED_DOMAINS = 32



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
        scope: The skip scope the request ran with (its mapping entry's; ``verify`` when dense).
    """

    text: str
    tokens: torch.Tensor
    stats: DecodeStats
    domain: str | None
    skip_set: frozenset[int]
    routed: bool
    route: RouteDecision | None = None
    scope: str = "verify"

    @property
    def similarity(self) -> float | None:
        """The router's best cosine similarity (``None`` when the router was not asked)."""
        return None if self.route is None else self.route.similarity


@dataclass
class Admission:
    """A request admitted into a batch, with what the controller decided for it.

    Attributes:
        row: its row in the batch (tokens and statistics as it decodes).
        domain, skip_set, routed, route, scope: as :class:`ControllerResult`.
    """

    row: Row
    domain: str | None
    skip_set: frozenset[int]
    routed: bool
    route: RouteDecision | None
    scope: str


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
        scope: ``None`` (default): each domain runs with its mapping entry's skip scope
            (``MappingEntry.scope``: what its search measured; ``verify`` for entries written
            before the scope was recorded). ``"verify"`` or ``"all"``: that scope for every
            domain instead (logged when it differs from an entry's).
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
        if scope is not None and scope not in SCOPES:
            raise ValueError(f"scope={scope!r} is not a skip scope; expected one of {', '.join(SCOPES)}")
        # The keyword settings given replace the protocol's (the former arguments keep working).
        # The skip scope is not taken from the protocol: each mapping entry carries the scope
        # its search measured, and only an explicit `scope=` overrides them all.
        given = {
            "eos_token_ids": eos_token_ids, "temperature": temperature,
            "max_new_tokens": max_new_tokens, "verification": verification,
        }
        protocol = (protocol or DecodeProtocol()).replace(**{k: v for k, v in given.items() if v is not None})
        if not isinstance(mapping, DomainMapping):
            mapping = load_mapping(mapping)
        check_mapping_model(mapping, model_id, target.num_layers)
        self.target = target
        self.tokenizer = tokenizer
        self.mapping = mapping
        self.drafter_factory = drafter_factory
        self.protocol = protocol
        self.eos_token_ids = protocol.eos_token_ids
        self.router = router
        self.model_id = model_id
        self.scope = scope  # an explicit override of every entry's scope, else None
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
        # Each entry is served in the scope its search measured (an override is logged).
        self._scopes = {d: scope or e.scope for d, e in mapping.entries.items()}
        overridden = sorted(d for d, e in mapping.entries.items() if e.skip_set and self._scopes[d] != e.scope)
        if overridden:
            log.warning(
                "scope=%s overrides the mapping's scope of %s: their outputs differ from what the search measured",
                scope, ", ".join(overridden),
            )
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
        self.entry_rules = entry_rules
        self._reported: set[str] = set()
        # One batch at a time on the model: the server's steps and a one-shot generate take
        # turns (a controller rebuilt by with_mapping shares it: the model is the same).
        self.lock = threading.Lock()

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
        if domain not in self._reported and len(self._reported) <= MAX_REPORTED_DOMAINS:
            # Clients choose these names: one line per name, for a bounded number of names
            # (unbounded, a client sending random names filled the log with one line each).
            self._reported.add(domain)
            if len(self._reported) > MAX_REPORTED_DOMAINS:
                log.warning("more than %d unmapped domain names seen; further ones are not logged", MAX_REPORTED_DOMAINS)
                return frozenset()
            where = f" {self.mapping.path}" if self.mapping.path else ""
            shown = domain if len(domain) <= 64 else domain[:61] + "..."
            log.warning(
                "domain %r has no entry in the mapping%s (mapped: %s); its requests run dense. "
                "Run the search for it to get a skip set.",
                shown, where, ", ".join(self.domains) or "none",
            )
        return frozenset()

    def scope_for(self, domain: str | None) -> str:
        """The skip scope a request of ``domain`` runs with: its entry's (``verify`` when the
        domain has no entry: a dense request is the same in both scopes)."""
        return self._scopes.get(domain, "verify") if domain is not None else "verify"

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

    def with_mapping(self, mapping: DomainMapping | str | os.PathLike[str]) -> TSSController:
        """A controller serving ``mapping`` on the same loaded model, drafter factory, router
        and settings (the server's reload; this controller is left unchanged).

        Raises:
            MappingError: The mapping is corrupt or for another model.
        """
        if not isinstance(mapping, DomainMapping):
            mapping = load_mapping(mapping)
        missing = [d for d in mapping.domains if d not in self.system_prompts]
        prompts = {**self.system_prompts, **(domain_system_prompts(missing) if missing else {})}
        new = type(self)(
            self.target, self.tokenizer, mapping, self.drafter_factory, self.eos_token_ids, self.router,
            model_id=self.model_id, scope=self.scope, temperature=self.temperature,
            max_new_tokens=self.max_new_tokens, system_prompts=prompts, verification=self.verifier,
            entry_rules=self.entry_rules,
        )
        new.lock = self.lock  # same model, same turns
        return new

    # ----------------------------------------------------------------------------- serving
    def prompt_ids(
        self, prompt: str | torch.Tensor | Sequence[int] | Sequence[Mapping[str, str]], system_prompt: str | None = None
    ) -> torch.Tensor:
        """Token ids of a request: text goes through the chat template (as in the search);
        a list of chat messages (``{"role", "content"}`` dicts) too, with ``system_prompt`` as
        a first system message when the messages have none; ids are used as given.

        Returns:
            ``torch.LongTensor`` of shape ``(P,)``.
        """
        if is_chat(prompt):
            return chat_ids(self.tokenizer, prompt, system_prompt)  # type: ignore[arg-type]
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("the prompt is empty; give some text")
            return format_prompt(self.tokenizer, Example(id="request", prompt=prompt, references=()), system_prompt)
        ids = torch.as_tensor(prompt, dtype=torch.long).reshape(-1)
        if ids.numel() == 0:
            raise ValueError("the prompt is empty; give at least one token")
        return ids

    def admit(
        self,
        batch: BatchEngine,
        prompt: str | torch.Tensor | Sequence[int] | Sequence[Mapping[str, str]],
        domain: str | None = None,
        *,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        system_prompt: str | None = None,
        tag: object = None,
    ) -> Admission:
        """Resolve a request's domain, skip set, scope and rule and add it to ``batch``; it
        joins at the batch's next step and keeps these for its whole life (a mapping reloaded
        meanwhile applies to later requests only).

        Args:
            batch: the running batch (:meth:`new_batch`).
            prompt: Text (formatted with the chat template), chat messages, or
                ``torch.LongTensor`` ids of shape ``(P,)``.
            domain: The request's domain label; ``None`` asks the router (if any).
            max_new_tokens: Generation length (default: the controller's).
            temperature: Overrides the controller's temperature.
            seed: Seeds sampling (temperature > 0).
            system_prompt: System message for text prompts; ``None``: the resolved domain's
                (``system_prompts``), if any (chat messages that carry their own keep it).
            tag: The caller's handle, kept on the row (``row.tag``).
        """
        # The router embeds prompts without a system message (as it was fitted); the domain's
        # own system message is added once the domain is known.
        ids = self.prompt_ids(prompt, system_prompt)
        resolved, decision = self.resolve(ids, domain)
        own = self.system_prompts.get(resolved) if resolved is not None else None
        if (isinstance(prompt, str) or (is_chat(prompt) and not has_system(prompt))) and system_prompt is None and own:  # type: ignore[arg-type]
            ids = self.prompt_ids(prompt, own)
        skip = self.skip_set_for(resolved)
        scope = self.scope_for(resolved)
        row = batch.admit(
            ids,
            max_new_tokens=int(max_new_tokens or self.max_new_tokens),
            drafter=self.drafter_factory(),
            skip=skip,
            scope=scope,
            temperature=self.temperature if temperature is None else float(temperature),
            seed=seed,
            eos_token_ids=self.eos_token_ids,
            verification=self.verifier_for(resolved),
            tag=tag,
        )
        return Admission(row=row, domain=resolved, skip_set=skip, routed=decision is not None and decision.domain is not None,
                         route=decision, scope=scope)

    def result(self, admission: Admission) -> ControllerResult:
        """The answer of an admitted request (finished, or stopped early by its caller)."""
        res = admission.row.result()
        return ControllerResult(
            text=self.tokenizer.decode(res.tokens, skip_special_tokens=True),
            tokens=res.tokens,
            stats=res.stats,
            domain=admission.domain,
            skip_set=admission.skip_set,
            routed=admission.routed,
            route=admission.route,
            scope=admission.scope,
        )

    def new_batch(self, depth: DepthPolicy | None = None) -> BatchEngine:
        """An empty batch on this controller's target (the server keeps one for its life)."""
        return BatchEngine(self.target, depth)

    def generate(
        self,
        prompt: str | torch.Tensor | Sequence[int],
        domain: str | None = None,
        *,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        system_prompt: str | None = None,
        on_step: StepHook | None = None,
    ) -> ControllerResult:
        """Serve one request alone: :meth:`admit` into a batch of its own, then step it to the
        end (the server's path, with one row).

        Args:
            prompt, domain, max_new_tokens, temperature, seed, system_prompt: as :meth:`admit`.
            on_step: Sees the tokens committed by the prefill and by every step
                (``torch.LongTensor`` of shape ``(k,)``); returning True stops the request
                there (streaming, cancellation).
        """
        with self.lock:  # one batch at a time on the model
            batch = self.new_batch()
            admission = self.admit(
                batch, prompt, domain, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                system_prompt=system_prompt,
            )
            while batch.rows:
                for done in batch.step():
                    if on_step is not None and on_step(done.tokens):
                        batch.drop(done.row)
        return self.result(admission)


def domain_system_prompts(
    domains: Iterable[str], chosen: DomainConfig | None = None, config_dirs: Sequence[str | os.PathLike[str]] | None = None
) -> dict[str, str | None]:
    """Each domain's ``system_prompt``, read from its config as the search read it.

    Args:
        domains: The mapped domain names.
        chosen: The command's ``+domain=NAME`` config; it wins for its own name.
        config_dirs: Where ``domain/<name>.yaml`` is looked up; ``None``: the shipped
            ``conf/`` and the running command's ``--config-dir`` folders.

    A domain whose config is not found is logged (its requests get no system message).
    """
    from tss_opt.config.search_path import domain_config_dirs
    from tss_opt.evaluation.domains import DomainError, read_domain_config

    dirs = list(config_dirs) if config_dirs is not None else domain_config_dirs()
    out: dict[str, str | None] = {}
    for name in domains:
        if chosen is not None and name == chosen.name:
            out[name] = chosen.system_prompt
            continue
        try:
            out[name] = read_domain_config(name, dirs).system_prompt
        except DomainError as e:
            log.warning(
                "domain %r: no config found (%s); its requests get no system prompt. Pass the "
                "search's --config-dir to apply it.", name, e,
            )
    return out


def check_mapping_model(mapping: DomainMapping, model_id: str | None, num_layers: int) -> None:
    """Refuse a mapping searched on another model: its id when ``model_id`` is known, else its
    layer count (the skip sets would skip the wrong layers).

    Raises:
        MappingError: The mapping is for another model.
    """
    if model_id is not None:
        mapping.check_model(model_id, num_layers)
    elif mapping.num_layers is not None and mapping.num_layers != num_layers:
        where = f" {mapping.path}" if mapping.path else ""
        raise MappingError(
            f"The mapping{where} is for model '{mapping.model}' ({mapping.num_layers} layers), but "
            f"the target has {num_layers} layers; its skip sets would skip the wrong layers. Use "
            "the mapping file searched on this model or run the search for it."
        )
