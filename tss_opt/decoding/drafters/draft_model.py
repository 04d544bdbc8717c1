"""A separate causal LM (sharing the target's tokenizer) drafts a chain; also self-drafting.

Self-drafting is the same drafter with the target's own weights under a fixed, larger skip
set (Draft & Verify, LayerSkip): it keeps its own KV cache, so the target's cache never sees
draft tokens, and it applies its skip set through the one skip mechanism.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tss_opt.config.drafters import DrafterConfigError
from tss_opt.decoding.cache import SkipAwareCache, crop_to, with_cache
from tss_opt.decoding.drafter import Drafter, DrafterCapabilities, NoDrafter
from tss_opt.decoding.drafters.building import WeightCache, builds, fixed_size, need_target
from tss_opt.decoding.host_syncs import upload
from tss_opt.decoding.linear import packed_linears
from tss_opt.decoding.sizing import (
    AUTO,
    MODEL_CHAIN_PRIOR,
    ContextSized,
    load_or_measure_draft_cost,
    load_profile,
)
from tss_opt.decoding.sizing.measure import draft_seconds_per_token
from tss_opt.decoding.skip import SkipController
from tss_opt.decoding.tree import DraftTree

if TYPE_CHECKING:
    from tss_opt.decoding.target import TargetModel
    from tss_opt.models.loading import LoadedModel


class DraftModelDrafter(Drafter):
    """Drafts ``num_tokens`` tokens autoregressively with a small causal LM.

    Args:
        model: a transformers causal LM with the target's vocabulary.
        num_tokens: chain length per step (at most; ``sizer`` overrides it).
        temperature: 0 drafts greedily (``probs`` left unset); > 0 samples and returns ``q``.
        skip: layers of ``model`` bypassed while drafting (self-drafting); empty otherwise.
        layers_path: where ``model`` keeps its decoder layers (for ``skip``).
        return_probs: greedy drafting (``temperature`` 0) also returns the draft distribution
            ``softmax(logits)`` per node (``DraftTree.probs`` with ``sampled=False``), which
            relaxed verification (``verification=diversed|cospec``) blends with the target's;
            exact verification ignores it. The engine turns it on for those modes.
        sizer: the chain length per context length (``num_tokens=auto``,
            :func:`sized_model_chain`); 0 drafts nothing (no forward of the draft model).

    A node's confidence is the draft model's softmax probability of its token.
    """

    #: Its trees carry confidences (TAPS routing), it gives ``probs`` (relaxed verification),
    #: and its proposals depend on the context only (``evaluator=replay``).
    capabilities = DrafterCapabilities(confidence=True, distribution=True, replayable=True)
    sizing_prior = MODEL_CHAIN_PRIOR

    def __init__(
        self,
        model: Any,
        num_tokens: int = 5,
        temperature: float = 0.0,
        skip: Iterable[int] = (),
        layers_path: str = "model.layers",
        seed: int = 0,
        return_probs: bool = False,
        sizer: ContextSized | None = None,
    ) -> None:
        if num_tokens < 1:
            raise ValueError(f"draft num_tokens={num_tokens}; expected >= 1")
        self.model = model
        self.num_tokens = num_tokens
        self.sizer = sizer
        self.temperature = temperature
        self.skip = frozenset(int(i) for i in skip)
        self._skipper = SkipController.for_model(model, layers_path) if self.skip else None
        if self._skipper is not None:
            from tss_opt.decoding.skip import validate_skip

            validate_skip(self.skip, self._skipper.num_layers)
        self.device = next(model.parameters()).device
        self.seed = seed
        self.return_probs = return_probs
        # On the model's device: multinomial draws where q is (no copy of q to the host).
        self._gen = torch.Generator(device=self.device).manual_seed(seed)
        self._cache: SkipAwareCache | None = None
        self._seen: list[int] = []  # tokens whose keys/values are in self._cache
        self._max_depth: int | None = None  # the engine's budget for the step being proposed

    def reset(self, prompt_ids: torch.Tensor) -> None:
        self._cache = SkipAwareCache(config=self.model.config)
        self._seen = []
        # Every request drafts from the same stream: the same seed gives the same output,
        # however many requests this drafter served before.
        self._gen.manual_seed(self.seed)

    def _ctx(self) -> Any:
        return self._skipper.apply(self.skip) if self._skipper is not None else nullcontext()

    @torch.inference_mode()
    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """Append the tokens ``x`` (``torch.LongTensor`` of shape ``(1, q)`` on the model's
        device) to the draft cache; return ``(vocab,)`` logits after the last one."""
        assert self._cache is not None
        start = self._cache.get_seq_length()
        pos = torch.arange(start, start + x.shape[1], device=self.device).unsqueeze(0)
        # Prepacked products for a draft step's few rows where the model's layers were packed
        # (the target's own, for self-drafting in bfloat16 on a CPU: decoding/linear.py).
        with packed_linears():
            out = self.model(input_ids=x, position_ids=pos, **with_cache(self._cache), use_cache=True, logits_to_keep=1)
        return out.logits[0, -1]

    def propose_within(self, context: torch.Tensor, max_depth: int) -> DraftTree:
        """Draft at most ``max_depth`` tokens: each one costs a draft forward."""
        self._max_depth = max_depth
        try:
            return self.propose(context)
        finally:
            self._max_depth = None

    @torch.inference_mode()
    def propose(self, context: torch.Tensor) -> DraftTree:
        num_tokens = self.num_tokens if self.sizer is None else self.sizer(int(context.numel()))
        if self._max_depth is not None:
            num_tokens = min(num_tokens, self._max_depth)
        if num_tokens < 1:
            return DraftTree.empty()
        if self._cache is None:
            self.reset(context)
        ctx = context.tolist()
        # Roll the draft cache back to the longest prefix it shares with the committed text.
        common = 0
        for a, b in zip(self._seen, ctx):
            if a != b:
                break
            common += 1
        common = min(common, len(ctx) - 1)  # always re-feed at least the last token
        crop_to(self._cache, common)
        del self._seen[common:]
        # Drafted tokens stay on the device and feed the next forward there; tokens and
        # confidences come back to the host once per step, not per token (each read waits for the device).
        toks: list[torch.Tensor] = []  # [1] each, on the device
        confs: list[torch.Tensor] = []  # [1] each: the draft probability of the token
        probs: list[torch.Tensor] = []
        with self._ctx():
            logits = self._forward(upload(torch.tensor([ctx[common:]], dtype=torch.long), self.device))
            for k in range(num_tokens):
                if self.temperature > 0:
                    q = torch.softmax(logits.float() / self.temperature, dim=-1)
                    tok = torch.multinomial(q, 1, generator=self._gen)
                    probs.append(q)
                else:
                    q = torch.softmax(logits.float(), dim=-1)
                    tok = logits.argmax().reshape(1)
                    if self.return_probs:  # the draft distribution, for relaxed verification
                        probs.append(q)
                toks.append(tok)
                confs.append(q.gather(0, tok))
                if k + 1 < num_tokens:
                    logits = self._forward(tok.view(1, 1))
        tok_list, conf_list = torch.stack([torch.cat(toks).double(), torch.cat(confs).double()]).tolist()
        tokens = [int(t) for t in tok_list]
        self._seen.extend(ctx[common:])
        self._seen.extend(tokens[:-1])  # the last drafted token was not fed
        return DraftTree.chain(
            tokens,
            probs=torch.stack(probs) if probs else None,
            confidence=torch.tensor(conf_list, dtype=torch.float32),
            sampled=self.temperature > 0,
        )


class SelfDrafter(DraftModelDrafter):
    """The target drafts for itself under a fixed, larger skip set."""

    def __init__(self, target_model: Any, skip: Iterable[int], num_tokens: int = 5, **kwargs: Any) -> None:
        skip = frozenset(skip)
        if not skip:
            raise ValueError("self-drafting needs a non-empty draft skip set (drafter.skip), e.g. [4, 5, 6, 7]")
        super().__init__(target_model, num_tokens=num_tokens, skip=skip, **kwargs)


def sized_model_chain(
    target: TargetModel,
    profile: str,
    make: Callable[[int], Drafter],
    *,
    cost_name: str,
    max_tokens: int = 8,
    directory: str | Path | None = None,
) -> Drafter:
    """``num_tokens=auto`` for model-drafted chains (``draft_model``, ``self``, ``t2d``): per
    context bucket, the chain length ``0..max_tokens`` maximising expected tokens per second,
    where a chain of ``k`` costs ``k`` draft forwards plus the verification of ``k`` nodes.

    Args:
        profile: the acceptance profile's name (``profile-<profile>.json``, else
            :attr:`DraftModelDrafter.sizing_prior`).
        make: builds the drafter with a given chain length (used to measure the cost per
            drafted token once, cached as ``draft-<cost_name>-<key>.json``, and to build it).
        cost_name: names the draft model in the cache (one file per draft model or skip set).

    Returns:
        The drafter with its ``sizer``, or :class:`NoDrafter` (with the ``sizer`` that says
        why) when no length pays at any context.
    """
    token_s = load_or_measure_draft_cost(
        target, cost_name, lambda: draft_seconds_per_token(target, make(max_tokens)), directory
    )
    accept = load_profile(profile, DraftModelDrafter.sizing_prior, directory)
    sizer = ContextSized.chain(target, accept, max_tokens=max_tokens, token_s=token_s, directory=directory)
    drafter = NoDrafter() if sizer.never_speculates else make(max(c.nodes for c in sizer.choices.values()))
    drafter.sizer = sizer
    return drafter


def _model_chain(
    target: TargetModel,
    loaded: LoadedModel,
    model: Mapping[str, Any] | None,
    weights: WeightCache | None,
    *,
    num_tokens: int | str,
    temperature: float,
    seed: int,
    return_probs: bool,
    max_tokens: int,
    drafter: str,
) -> Drafter:
    """``draft_model`` and ``t2d`` (``drafter`` names the acceptance profile when sized)."""
    from tss_opt.models import load_model

    if not model:
        raise DrafterConfigError(
            f"drafter {drafter!r} needs drafter.model: a model config mapping (like conf/model/*.yaml)"
        )
    if num_tokens == AUTO:
        need_target(drafter, "num_tokens", target)
    plain = dict(model)
    # The draft model runs beside the target: on its device, in its dtype (loaded
    # with its own defaults it ran on the CPU, or on cuda:0 for every launched worker).
    plain["device"] = str(target.device)
    plain["dtype"] = loaded.config.dtype
    key = json.dumps(plain, sort_keys=True, default=str)
    draft = (weights or WeightCache()).get(f"draft_model:{key}", lambda: load_model(plain))
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
                                 max_tokens=fixed_size(drafter, "max_tokens", max_tokens))
    return make(fixed_size(drafter, "num_tokens", num_tokens))


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:10]


@builds(DraftModelDrafter)
def build_draft_model(
    target: TargetModel,
    loaded: LoadedModel,
    *,
    model: Mapping[str, Any] | None,
    num_tokens: int | str,
    max_tokens: int,
    temperature: float,
    seed: int,
    return_probs: bool,
    weights: WeightCache | None = None,
) -> Drafter:
    """A separate small causal LM with the target's vocabulary; ``model`` is a model config.
    ``num_tokens="auto"`` (the default) sizes the chain per context length (``0..max_tokens``;
    plain decoding when no length pays anywhere; :func:`sized_model_chain`).

    Its ``device`` and ``dtype`` are the target's, whatever the config says."""
    return _model_chain(target, loaded, model, weights, num_tokens=num_tokens, temperature=temperature, seed=seed,
                        return_probs=return_probs, max_tokens=max_tokens, drafter="draft_model")


@builds(DraftModelDrafter)
def build_t2d(
    target: TargetModel,
    loaded: LoadedModel,
    *,
    path: str | None = None,
    num_tokens: int | str,
    max_tokens: int,
    temperature: float,
    seed: int,
    return_probs: bool,
    train: Mapping[str, Any] | None = None,
    weights: WeightCache | None = None,
) -> Drafter:
    """T2D: the pruned, distilled copy of the target that ``train_drafter drafter=t2d`` saved
    in ``path``, drafting as ``draft_model`` does. ``train`` holds the training settings
    (``tss_opt.config.t2d.T2DSettings``) and is not used for decoding."""
    if not path:
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
    return _model_chain(target, loaded, model, weights, num_tokens=num_tokens, temperature=temperature, seed=seed,
                        return_probs=return_probs, max_tokens=max_tokens, drafter="t2d")


@builds(SelfDrafter)
def build_self(
    target: TargetModel,
    loaded: LoadedModel,
    *,
    skip: Iterable[int] | None = None,
    num_tokens: int | str,
    max_tokens: int,
    temperature: float,
    seed: int,
    return_probs: bool,
) -> Drafter:
    """Self-drafting: the target under a larger skip set (its own KV cache).
    ``num_tokens="auto"`` (the default) sizes the chain as for ``draft_model`` (profile ``self``)."""
    layers = sorted(int(i) for i in (skip or ()))

    def make(k: int) -> Drafter:
        return SelfDrafter(target.model, skip=layers, num_tokens=k, temperature=temperature,
                           layers_path=loaded.config.layers_path, seed=seed, return_probs=return_probs)

    if num_tokens == AUTO:
        need_target("self", "num_tokens", target)
        if not layers:  # refused before anything is measured
            raise DrafterConfigError("self-drafting needs a non-empty draft skip set (drafter.skip), e.g. [4, 5, 6, 7]")
        return sized_model_chain(target, "self", make, cost_name=f"self_{_digest(str(layers))}_token",
                                 max_tokens=fixed_size("self", "max_tokens", max_tokens))
    return make(fixed_size("self", "num_tokens", num_tokens))
