"""Build drafters from config with ``hydra.utils.instantiate``: one builder per drafter.

A drafter config (``conf/drafter/<name>.yaml``) is a mapping with ``name``, ``_target_``
(dotted path of the builder, instantiated by Hydra) and the drafter's settings::

    name: pld
    _target_: tss_opt.decoding.drafters.registry.build_pld
    num_tokens: 10

Every builder takes ``(target, loaded, **settings)``. A config without ``_target_`` takes the
one of the shipped ``conf/drafter/<name>.yaml`` (the drafter names are data, not code). Adding
a drafter: write the class and a builder (here, or anywhere importable), add
``conf/drafter/<name>.yaml`` (see docs/drafters.md).
"""

from __future__ import annotations

import inspect
import json
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tss_opt.config import config_dir
from tss_opt.decoding.drafter import Drafter, DrafterCapabilities
from tss_opt.decoding.drafters.errors import DrafterConfigError
from tss_opt.decoding.sizing import AUTO

if TYPE_CHECKING:
    from tss_opt.decoding.target import TargetModel
    from tss_opt.models.loading import LoadedModel

__all__ = [
    "DrafterConfigError",
    "available_drafters",
    "build_drafter",
    "builds",
    "distribution_drafters",
    "drafter_capabilities",
]

DrafterBuilder = Callable[..., Drafter]
_RESERVED = ("name", "_target_")
MISSING = "???"  # OmegaConf's mandatory value, when a config was converted with resolve only


def available_drafters() -> list[str]:
    """The shipped drafter configs (``conf/drafter/*.yaml``), by name."""
    return sorted(p.stem for p in (config_dir() / "drafter").glob("*.yaml"))


def _to_plain(cfg: Any) -> dict[str, Any]:
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    return dict(cfg)


def _shipped_target(name: Any) -> str:
    from omegaconf import OmegaConf

    if name not in available_drafters():
        raise DrafterConfigError(
            f"unknown drafter {name!r}; available: {', '.join(available_drafters())}. "
            "Set drafter.name to one of them (or give drafter._target_ for your own builder)"
        )
    return str(OmegaConf.load(config_dir() / "drafter" / f"{name}.yaml")["_target_"])


def _builder(target_path: str) -> DrafterBuilder:
    import hydra.utils

    try:
        return hydra.utils.get_method(target_path)
    except Exception as e:  # Hydra raises ImportError or its own error types
        raise DrafterConfigError(f"drafter _target_={target_path!r} cannot be imported: {e}") from e


def builds(drafter_class: str) -> Callable[[DrafterBuilder], DrafterBuilder]:
    """Mark a builder with the dotted path of the :class:`Drafter` class it returns, so that
    the class's ``capabilities`` can be read from a config before anything is built (the
    class is imported only then)."""

    def mark(builder: DrafterBuilder) -> DrafterBuilder:
        builder.drafter_class = drafter_class  # type: ignore[attr-defined]
        return builder

    return mark


def drafter_capabilities(cfg: Mapping[str, Any]) -> DrafterCapabilities | None:
    """The class-level capabilities of the drafter ``cfg`` builds (its builder marked with
    :func:`builds`), without building it; ``None`` when the builder names no class.

    Capabilities that depend on the drafter's parts (SAMD's fallback, TAPS members) are the
    instance's; this is the class's declaration.

    Raises:
        DrafterConfigError: unknown drafter name, or a builder that cannot be imported.
    """
    import hydra.utils

    plain = _to_plain(cfg)
    builder = _builder(str(plain.get("_target_") or _shipped_target(plain.get("name"))))
    path = getattr(builder, "drafter_class", None)
    if path is None:
        return None
    cls = hydra.utils.get_class(path)
    return cls.capabilities  # type: ignore[no-any-return]


def distribution_drafters() -> list[str]:
    """The shipped drafters (``conf/drafter/``) whose class gives a per-node distribution:
    the ones relaxed verification accepts."""
    out = []
    for name in available_drafters():
        caps = drafter_capabilities({"name": name})
        if caps is not None and caps.distribution:
            out.append(name)
    return out


def build_drafter(cfg: Mapping[str, Any], target: TargetModel, loaded: LoadedModel) -> Drafter:
    """Build the drafter described by ``cfg`` (``hydra.utils.instantiate`` of its ``_target_``).

    Args:
        cfg: ``_target_`` (a dotted builder path) plus settings; ``name`` alone selects a
            shipped config's builder.
        target: the verifier (self-drafting and EAGLE use its model).
        loaded: the loaded target model with its config and tokenizer.

    Raises:
        DrafterConfigError: unknown name (the message lists the available ones), a builder
            that cannot be imported, a setting the builder does not take, or a mandatory
            setting (``???``) that the chosen options need.
    """
    import hydra.utils

    plain = _to_plain(cfg)
    name = plain.get("name")
    target_path = str(plain.get("_target_") or _shipped_target(name))
    builder = _builder(target_path)
    # A mandatory value left unset ("???") is dropped: the builder's default applies and the
    # builder says what is missing when it is really needed (eagle's path unless random_init).
    settings = {
        k: v
        for k, v in plain.items()
        if k not in _RESERVED and not (isinstance(v, str) and v == MISSING)
    }
    params = inspect.signature(builder).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        accepted = [p for p in params if p not in ("target", "loaded")]
        extra = sorted(set(settings) - set(accepted))
        if extra:
            raise DrafterConfigError(
                f"drafter {name!r} does not take setting(s) {', '.join(extra)}; it takes: {', '.join(accepted)}"
            )
    # _convert_="all": builders receive plain dicts and lists, not OmegaConf containers. The
    # model objects are passed to the partial, not to instantiate, which would turn the
    # LoadedModel dataclass into a config node; the builder's own errors then stay unwrapped.
    make = hydra.utils.instantiate({"_target_": target_path, **settings}, _partial_=True, _convert_="all")
    return make(target=target, loaded=loaded)


# ----------------------------------------------------------------------------- builders
@builds("tss_opt.decoding.drafters.prompt_lookup.PromptLookupDrafter")
def build_pld(
    target: TargetModel,
    loaded: LoadedModel,
    num_tokens: int | str = 10,
    max_ngram: int = 3,
    min_ngram: int = 1,
    max_tokens: int = 10,
) -> Drafter:
    """Prompt lookup (model-free chain) of ``num_tokens`` (default 10, the paper's setting).
    ``num_tokens="auto"`` sizes the chain to the hardware per context length, ``1..max_tokens``
    or no speculation at all (:meth:`PromptLookupDrafter.sized_to`).

    Why pld stays fixed by default while the tree drafters are sized: pld is the search's
    default drafter, and a search measures skip sets under one fixed decoding protocol. A
    hardware-chosen chain would differ between the hosts of one shared study, and on a CPU in
    float32 it chooses no speculation at all, which leaves every set with accepted length 1.
    Serve with ``drafter.num_tokens=auto``."""
    from tss_opt.decoding.drafters.prompt_lookup import PromptLookupDrafter

    if num_tokens == AUTO:
        _need_target("pld", "num_tokens", target)
        return PromptLookupDrafter.sized_to(target, max_tokens=_fixed("pld", "max_tokens", max_tokens),
                                            max_ngram=max_ngram, min_ngram=min_ngram)
    return PromptLookupDrafter(num_tokens=_fixed("pld", "num_tokens", num_tokens), max_ngram=max_ngram,
                               min_ngram=min_ngram)


def _need_target(drafter: str, setting: str, target: TargetModel | None) -> None:
    """``auto`` measures this target's hardware: refuse clearly without one."""
    if target is None:
        raise DrafterConfigError(
            f"drafter {drafter!r}: {setting}=auto sizes the drafter to the target's hardware and needs the "
            f"target; pass the TargetModel, or fix the size (e.g. {setting}="
            + ("builtin:token_recycle_15.json)" if setting == "template" else "10)")
        )


def _fixed(drafter: str, setting: str, value: Any) -> int:
    """A size setting that is not ``auto``: a positive integer, else a clear error."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DrafterConfigError(
            f"drafter {drafter!r}: {setting}={value!r}; expected a positive integer, or 'auto' to size it to "
            "the hardware (docs/drafters.md, 'Sized to the hardware')"
        )
    return value


# Weights a drafter only reads (draft models, EAGLE heads), loaded once per process: the
# evaluator builds a fresh drafter per trial, and reloading weights each time is wasted work.
# Drafter state (KV caches, tables) lives in the drafter objects, never in these.
_WEIGHTS: dict[str, Any] = {}
# EAGLE heads reuse their target's embeddings: keyed per target model, dropped with it.
_HEADS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _cached_weights(key: str, load: Callable[[], Any], owner: Any = None) -> Any:
    store = _WEIGHTS if owner is None else _HEADS.setdefault(owner, {})
    if key not in store:
        store[key] = load()
    return store[key]


@builds("tss_opt.decoding.drafters.draft_model.DraftModelDrafter")
def build_draft_model(
    target: TargetModel,
    loaded: LoadedModel,
    model: Mapping[str, Any] | None = None,
    num_tokens: int | str = AUTO,
    temperature: float = 0.0,
    seed: int = 0,
    return_probs: bool = False,
    max_tokens: int = 8,
) -> Drafter:
    """A separate small causal LM with the target's vocabulary; ``model`` is a model config.
    ``num_tokens="auto"`` sizes the chain to the hardware per context length (``0..max_tokens``;
    plain decoding when no length pays anywhere; :func:`~tss_opt.decoding.drafters.draft_model.sized_model_chain`).

    Its ``device`` and ``dtype`` are the target's, whatever the config says."""
    return _draft_model(target, loaded, model, num_tokens=num_tokens, temperature=temperature, seed=seed,
                        return_probs=return_probs, max_tokens=max_tokens, drafter="draft_model")


def _draft_model(
    target: TargetModel,
    loaded: LoadedModel,
    model: Mapping[str, Any] | None,
    *,
    num_tokens: int | str,
    temperature: float,
    seed: int,
    return_probs: bool,
    max_tokens: int,
    drafter: str,
) -> Drafter:
    """``draft_model`` and ``t2d`` (``drafter`` names the acceptance profile when sized)."""
    from tss_opt.decoding.drafters.draft_model import DraftModelDrafter, sized_model_chain
    from tss_opt.models import load_model

    if not model:
        raise DrafterConfigError(
            "drafter 'draft_model' needs drafter.model: a model config mapping (like conf/model/*.yaml)"
        )
    if num_tokens == AUTO:
        _need_target(drafter, "num_tokens", target)
    plain = _to_plain(model)
    # The draft model runs beside the target: on its device, in its dtype (issue 24: loaded
    # with its own defaults it ran on the CPU, or on cuda:0 for every launched worker).
    plain["device"] = str(target.device)
    plain["dtype"] = loaded.config.dtype
    key = json.dumps(plain, sort_keys=True, default=str)
    draft = _cached_weights(f"draft_model:{key}", lambda: load_model(plain))
    d_vocab = int(draft.model.get_input_embeddings().weight.shape[0])
    t_vocab = int(target.model.get_input_embeddings().weight.shape[0])
    if d_vocab != t_vocab:
        raise DrafterConfigError(
            f"draft model {draft.config.name!r} has a vocabulary of {d_vocab} but the target has {t_vocab}; "
            "a draft model must share the target's tokenizer"
        )

    def make(k: int) -> Drafter:
        return DraftModelDrafter(
            draft.model, num_tokens=k, temperature=temperature, layers_path=draft.config.layers_path, seed=seed,
            return_probs=return_probs,
        )

    if num_tokens == AUTO:
        return sized_model_chain(target, drafter, make, cost_name=f"{drafter}_{_digest(key)}_token",
                                 max_tokens=_fixed(drafter, "max_tokens", max_tokens))
    return make(_fixed(drafter, "num_tokens", num_tokens))


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha1(text.encode()).hexdigest()[:10]


@builds("tss_opt.decoding.drafters.draft_model.DraftModelDrafter")
def build_t2d(
    target: TargetModel,
    loaded: LoadedModel,
    path: str | None = None,
    num_tokens: int | str = AUTO,
    temperature: float = 0.0,
    seed: int = 0,
    return_probs: bool = False,
    train: Mapping[str, Any] | None = None,
    max_tokens: int = 8,
) -> Drafter:
    """T2D: the pruned, distilled copy of the target that ``train_drafter drafter=t2d`` saved
    in ``path``, drafting as ``draft_model`` does. ``train`` holds the training settings
    (``tss_opt.training.t2d.T2DSettings``) and is not used for decoding."""
    from pathlib import Path

    if not path or path == MISSING:
        raise DrafterConfigError(
            "drafter 't2d' needs drafter.path: the folder written by `python -m tss_opt.cli.train_drafter "
            "+domain=NAME drafter=t2d` (e.g. storage/drafters/NAME/t2d)"
        )
    if not (Path(path).expanduser() / "config.json").is_file():
        raise DrafterConfigError(
            f"drafter.path={path!r} holds no T2D drafter (no config.json there); train one with "
            "`python -m tss_opt.cli.train_drafter +domain=NAME drafter=t2d` or fix the path"
        )
    model = {
        "name": "t2d",
        "source": "hf",
        "path": str(Path(path).expanduser()),
        "num_layers": 0,  # whatever the search kept
        "dtype": loaded.config.dtype,
        "device": loaded.config.device,
        "attn_implementation": loaded.config.attn_implementation,
        "layers_path": loaded.config.layers_path,
    }
    return _draft_model(target, loaded, model, num_tokens=num_tokens, temperature=temperature, seed=seed,
                        return_probs=return_probs, max_tokens=max_tokens, drafter="t2d")


@builds("tss_opt.decoding.drafters.draft_model.SelfDrafter")
def build_self(
    target: TargetModel,
    loaded: LoadedModel,
    skip: Iterable[int] = (),
    num_tokens: int | str = AUTO,
    temperature: float = 0.0,
    seed: int = 0,
    return_probs: bool = False,
    max_tokens: int = 8,
) -> Drafter:
    """Self-drafting: the target under a larger skip set (its own KV cache).
    ``num_tokens="auto"`` sizes the chain as for ``draft_model`` (profile ``self``)."""
    from tss_opt.decoding.drafters.draft_model import SelfDrafter, sized_model_chain

    skip = sorted(int(i) for i in skip)

    def make(k: int) -> Drafter:
        return SelfDrafter(
            target.model,
            skip=skip,
            num_tokens=k,
            temperature=temperature,
            layers_path=loaded.config.layers_path,
            seed=seed,
            return_probs=return_probs,
        )

    if num_tokens == AUTO:
        _need_target("self", "num_tokens", target)
        if not skip:  # refused before anything is measured
            raise DrafterConfigError("self-drafting needs a non-empty draft skip set (drafter.skip), e.g. [4, 5, 6, 7]")
        return sized_model_chain(target, "self", make, cost_name=f"self_{_digest(str(skip))}_token",
                                 max_tokens=_fixed("self", "max_tokens", max_tokens))
    return make(_fixed("self", "num_tokens", num_tokens))


@builds("tss_opt.decoding.drafters.token_recycle.TokenRecycleDrafter")
def build_token_recycle(
    target: TargetModel,
    loaded: LoadedModel,
    template: Any = AUTO,
    top_k: int = 8,
    keep_table: bool = True,
    max_nodes: int | None = None,
) -> Drafter:
    """Token Recycling; ``template=auto`` (the default) sizes the tree to the hardware, a
    template (``builtin:token_recycle_15.json``, a JSON path, a mapping) fixes it."""
    from tss_opt.decoding.drafters.token_recycle import TokenRecycleDrafter

    if template == AUTO:
        _need_target("token_recycle", "template", target)
        return TokenRecycleDrafter.sized_to(target, top_k=top_k, keep_table=keep_table, max_nodes=max_nodes)
    return TokenRecycleDrafter(
        template=template, top_k=top_k, keep_table=keep_table, max_nodes=max_nodes
    )


@builds("tss_opt.decoding.drafters.sam.SamdDrafter")
def build_samd(
    target: TargetModel,
    loaded: LoadedModel,
    threshold: int = 4,
    num_tokens: int | str = AUTO,
    max_tokens: int = 10,
    template: Any = AUTO,
    top_k: int = 8,
    keep_table: bool = True,
    fallback: str = "token_recycle",
) -> Drafter:
    """SAM decoding with a Token Recycling fallback ("SAMD Token Recycle"); ``fallback="none"``
    proposes nothing when the match is short (SAM decoding alone, replayable by evaluator=replay).
    ``num_tokens=auto`` (the default) sizes the match chain per context length
    (``0..max_tokens``), ``template=auto`` the fallback's tree; integers and templates fix them."""
    from tss_opt.decoding.drafter import NoDrafter
    from tss_opt.decoding.drafters.sam import SamdDrafter, sized_match_chain
    from tss_opt.decoding.drafters.token_recycle import TokenRecycleDrafter

    if fallback not in ("none", "token_recycle"):
        raise DrafterConfigError(
            f"drafter samd: fallback={fallback!r} is not a fallback; expected token_recycle or none"
        )
    if AUTO in (num_tokens, template):
        _need_target("samd", "num_tokens" if num_tokens == AUTO else "template", target)
    sizer = sized_match_chain(target, max_tokens=_fixed("samd", "max_tokens", max_tokens)) if num_tokens == AUTO else None
    fixed = _fixed("samd", "num_tokens", max_tokens if num_tokens == AUTO else num_tokens)
    if fallback == "none":
        aux: Drafter = NoDrafter()
    elif template == AUTO:
        aux = TokenRecycleDrafter.sized_to(target, top_k=top_k, keep_table=keep_table)
    else:
        aux = TokenRecycleDrafter(template=template, top_k=top_k, keep_table=keep_table)
    return SamdDrafter(threshold=threshold, num_tokens=fixed, fallback=aux, sizer=sizer)


@builds("tss_opt.decoding.drafters.eagle.EagleDrafter")
def build_eagle(
    target: TargetModel,
    loaded: LoadedModel,
    checkpoint: str | None = None,
    path: str | None = None,
    random_init: bool = False,
    seed: int = 0,
    total_tokens: int | str = AUTO,
    depth: int = 6,
    top_k: int = 8,
    return_probs: bool = False,
    draft_vocab: int | None = None,
) -> Drafter:
    """EAGLE-1 head from ``checkpoint`` (``path`` is its older name, still accepted), or a
    random head with ``random_init``; EAGLE-2 tree of ``total_tokens`` (``auto``, the
    default: sized to the hardware with ``depth`` and ``top_k`` as caps) over the head's draft
    vocabulary (``draft_vocab``: null = the head's, 0 = the whole vocabulary, N = its N most
    frequent)."""
    from tss_opt.decoding.drafters.eagle import (
        EagleDrafter,
        check_draft_vocab,
        load_eagle_head,
        random_eagle_head,
        warn_other_model,
    )

    given = [v for v in (checkpoint, path) if v and v != MISSING]
    if len(given) == 2 and str(checkpoint) != str(path):
        raise DrafterConfigError(
            f"drafter 'eagle' got drafter.checkpoint={checkpoint!r} and drafter.path={path!r}; "
            "path is the older name of checkpoint: give only drafter.checkpoint"
        )
    if random_init:
        head = _cached_weights(f"random:{seed}", lambda: random_eagle_head(target.model, seed=seed), target.model)
    elif not given:
        raise DrafterConfigError(
            "drafter 'eagle' needs drafter.checkpoint (a directory with config.json + pytorch_model.bin, "
            "e.g. one written by python -m tss_opt.cli.train_drafter), or drafter.random_init=true for a random head"
        )
    else:
        directory = str(given[0])
        head = _cached_weights(f"path:{directory}", lambda: load_eagle_head(directory, target.model), target.model)
        warn_other_model(directory, loaded.config.name)
    try:  # a bad setting is refused whatever the sizing below decides (NoDrafter included)
        check_draft_vocab(head, draft_vocab)
    except ValueError as e:
        raise DrafterConfigError(str(e)) from e
    if total_tokens == AUTO:  # sized to the hardware per context (decoding/sizing)
        from tss_opt.decoding.drafters.eagle import sized_eagle

        # sized with the head's own draft vocabulary (its per-level cost is measured with it);
        # another drafter.draft_vocab below changes that cost, not the tree's correctness
        drafter = sized_eagle(target, head, depth=depth, top_k=top_k, return_probs=return_probs)
    else:
        drafter = EagleDrafter(
            head, total_tokens=_fixed("eagle", "total_tokens", total_tokens), depth=depth, top_k=top_k,
            return_probs=return_probs,
        )
    if isinstance(drafter, EagleDrafter):  # total_tokens=auto may decide that no tree pays (NoDrafter)
        try:
            drafter.use_draft_vocab(draft_vocab)
        except ValueError as e:
            raise DrafterConfigError(str(e)) from e
    return drafter


def _build_members(
    kind: str, members: Any, target: TargetModel, loaded: LoadedModel
) -> list[tuple[str, Drafter]]:
    """Build TAPS members: each entry a drafter config (``name`` + settings, optional
    ``label`` naming it in statistics; default its ``name``)."""
    if not members or isinstance(members, (str, Mapping)):
        raise DrafterConfigError(
            f"drafter {kind!r} needs drafter.members: a list of drafter configs, e.g. "
            "[{name: pld}, {name: token_recycle}]; got " + repr(members)
        )
    out: list[tuple[str, Drafter]] = []
    for i, m in enumerate(members):
        plain = _to_plain(m) if not isinstance(m, str) else {"name": m}
        if not plain.get("name") and not plain.get("_target_"):
            raise DrafterConfigError(
                f"drafter {kind!r}: member {i} ({plain!r}) has no name; give e.g. {{name: pld}}"
            )
        if plain.get("name") in ("routed", "merged"):
            raise DrafterConfigError(
                f"drafter {kind!r}: member {i} is {plain['name']!r}; TAPS members must be single drafters"
            )
        label = str(plain.pop("label", None) or plain.get("name") or plain["_target_"])
        out.append((label, build_drafter(plain, target, loaded)))
    return out


@builds("tss_opt.decoding.drafters.taps.RoutedDrafter")
def build_routed(target: TargetModel, loaded: LoadedModel, members: Any = None) -> Drafter:
    """TAPS confidence routing: per step, the member tree with the highest mean confidence."""
    from tss_opt.decoding.drafters.taps import RoutedDrafter

    return RoutedDrafter(_build_members("routed", members, target, loaded))


@builds("tss_opt.decoding.drafters.taps.MergedDrafter")
def build_merged(target: TargetModel, loaded: LoadedModel, members: Any = None) -> Drafter:
    """TAPS merged tree: every member's tree under one root, verified in one pass."""
    from tss_opt.decoding.drafters.taps import MergedDrafter

    return MergedDrafter(_build_members("merged", members, target, loaded))
