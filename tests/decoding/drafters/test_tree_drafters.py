"""Tree drafters end to end: lossless greedy decoding, dense and sparse, and the tree mask.

Every tree drafter (Token Recycling with both templates, SAMD, EAGLE with a random head) must
emit exactly the tokens of plain greedy decoding of the same target: ``model.generate`` when
dense, a cache-free greedy loop under the skip set for scope "all", and drafting-free decoding
through the engine for scope "verify" (dense prefill, sparse steps). Each run also counts the
branching trees that were verified, so a pass cannot come from chains or empty drafts only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tss_opt.decoding.cache import keep_accepted
from tss_opt.decoding.drafters import (
    Drafter,
    DrafterConfigError,
    EagleDrafter,
    SamdDrafter,
    TokenRecycleDrafter,
    VerifyFeedback,
    available_drafters,
    build_drafter,
    random_eagle_head,
)
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.tree import DraftTree
from tss_opt.models import LoadedModel

REPO = Path(__file__).resolve().parents[3]
TINY_EOS = 258
MAX_NEW = 48


@pytest.fixture(scope="module")
def tiny_target(tiny: LoadedModel) -> TargetModel:
    return TargetModel(tiny.model)


@pytest.fixture(scope="module")
def tiny_prompts(tiny: LoadedModel) -> list[torch.Tensor]:
    tok = tiny.tokenizer
    chat = tok.apply_chat_template(
        [
            {
                "role": "user",
                "content": "Summarize: the cat sat on the mat, and the dog sat on the log.",
            }
        ],
        add_generation_prompt=True,
        tokenize=False,
    )
    texts = ["the cat sat on the mat. the cat sat on the hat. the dog", chat]
    return [
        torch.tensor(tok(t, add_special_tokens=False).input_ids, dtype=torch.long) for t in texts
    ]


# ----------------------------------------------------------------------------- references
def greedy_generate(model: torch.nn.Module, ids: torch.Tensor, n: int, eos: int) -> list[int]:
    """Dense reference: transformers' own greedy ``generate``."""
    out = model.generate(
        ids[None],
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=eos,
        attention_mask=torch.ones_like(ids[None]),
    )
    return out[0, ids.numel() :].tolist()


@torch.inference_mode()
def greedy_no_cache(
    target: TargetModel, ids: torch.Tensor, n: int, skip: frozenset[int], eos: int
) -> list[int]:
    """Sparse reference for scope "all": recompute the whole sequence every step under ``skip``."""
    seq = ids.clone()
    out: list[int] = []
    with target.skip(skip):
        for _ in range(n):
            logits = target.model(input_ids=seq[None], use_cache=False).logits[0, -1]
            t = int(logits.argmax())
            out.append(t)
            seq = torch.cat([seq, torch.tensor([t])])
            if t == eos:
                break
    return out


def reference(
    target: TargetModel, ids: torch.Tensor, n: int, skip: frozenset[int], scope: str, eos: int
) -> list[int]:
    if not skip:
        return greedy_generate(target.model, ids, n, eos)
    if scope == "all":
        return greedy_no_cache(target, ids, n, skip, eos)
    # scope "verify": dense prefill, sparse steps; drafting-free decoding is the reference.
    return (
        SpeculativeEngine(target, None, eos_token_ids=[eos])
        .generate(ids, max_new_tokens=n, skip=skip, scope="verify")
        .tokens.tolist()
    )


class Recorder(Drafter):
    """Wraps a drafter and records the shape of every proposed tree."""

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.capabilities = inner.capabilities
        self.sizes: list[int] = []
        self.branching = 0  # trees with a node (or the root) having >= 2 children

    def reset(self, prompt_ids: torch.Tensor) -> None:
        self.inner.reset(prompt_ids)

    def prefill_feedback(
        self, prompt_ids: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor
    ) -> None:
        self.inner.prefill_feedback(prompt_ids, logits, hidden)

    def propose(self, context: torch.Tensor) -> DraftTree:
        tree = self.inner.propose(context)
        self.sizes.append(len(tree))
        if any(len(k) > 1 for k in tree.children()):
            self.branching += 1
        return tree

    def update(self, feedback: VerifyFeedback) -> None:
        self.inner.update(feedback)


# ----------------------------------------------------------------------------- drafters
def _tr15(model: torch.nn.Module) -> Drafter:
    return TokenRecycleDrafter("builtin:token_recycle_15.json")


def _tr_large(model: torch.nn.Module) -> Drafter:
    return TokenRecycleDrafter("builtin:token_recycle_large.json")


def _samd(model: torch.nn.Module) -> Drafter:
    return SamdDrafter(threshold=4, num_tokens=10)


def _eagle(model: torch.nn.Module) -> Drafter:
    return EagleDrafter(random_eagle_head(model, seed=0), total_tokens=60, depth=6, top_k=8)


DRAFTERS: dict[str, Callable[[torch.nn.Module], Drafter]] = {
    "token_recycle_15": _tr15,
    "token_recycle_large": _tr_large,
    "samd": _samd,
    "eagle": _eagle,
}
# Dense once; then the first layer, the last layer and a middle pair, under both scopes.
SPARSE_CASES = [(frozenset(), "verify")] + [
    (frozenset(s), scope) for s in ({0}, {3}, {1, 2}) for scope in ("verify", "all")
]


SPARSE_IDS = [f"{'-'.join(map(str, sorted(s))) or 'dense'}-{scope}" for s, scope in SPARSE_CASES]


@pytest.mark.parametrize("skip,scope", SPARSE_CASES, ids=SPARSE_IDS)
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_tree_drafter_is_lossless(
    name: str,
    skip: frozenset[int],
    scope: str,
    tiny: LoadedModel,
    tiny_target: TargetModel,
    tiny_prompts: list[torch.Tensor],
) -> None:
    rec = Recorder(DRAFTERS[name](tiny.model))
    engine = SpeculativeEngine(tiny_target, rec, eos_token_ids=[TINY_EOS])
    for ids in tiny_prompts:
        want = reference(tiny_target, ids, MAX_NEW, skip, scope, TINY_EOS)
        got = engine.generate(ids, max_new_tokens=MAX_NEW, skip=skip, scope=scope)
        assert got.tokens.tolist() == want
        assert got.stats.accept_length >= 1.0
    # Trees with several branches were really verified (not just chains or empty drafts).
    assert rec.branching >= 5, (name, rec.sizes)
    assert max(rec.sizes) > 4


def test_references_agree(
    tiny: LoadedModel, tiny_target: TargetModel, tiny_prompts: list[torch.Tensor]
) -> None:
    """The three references coincide where they should (dense), so each one is sound."""
    ids = tiny_prompts[0]
    dense = greedy_generate(tiny.model, ids, MAX_NEW, TINY_EOS)
    assert greedy_no_cache(tiny_target, ids, MAX_NEW, frozenset(), TINY_EOS) == dense
    plain = SpeculativeEngine(tiny_target, None, eos_token_ids=[TINY_EOS]).generate(
        ids, max_new_tokens=MAX_NEW
    )
    assert plain.tokens.tolist() == dense
    # Drafting-free decoding with scope "all" equals the cache-free sparse loop.
    skip = frozenset({1, 2})
    sparse = SpeculativeEngine(tiny_target, None, eos_token_ids=[TINY_EOS]).generate(
        ids, max_new_tokens=MAX_NEW, skip=skip, scope="all"
    )
    assert sparse.tokens.tolist() == greedy_no_cache(tiny_target, ids, MAX_NEW, skip, TINY_EOS)
    assert sparse.tokens.tolist() != dense  # the skip set really changes the output


# ----------------------------------------------------------------------------- tree mask
@pytest.mark.parametrize("skip", [frozenset(), frozenset({1})])
def test_tree_mask_is_applied(
    skip: frozenset[int], tiny_target: TargetModel, tiny_prompts: list[torch.Tensor]
) -> None:
    """Per-node logits of one tree forward equal verifying each root-to-node path as a chain,
    and differ from verifying the same tokens with a plain causal mask."""
    target = tiny_target
    ids = tiny_prompts[0]
    prefix, root = ids[:-1], int(ids[-1])
    # Two branches below the root, two below node 0, one below node 1 and node 2.
    tree = DraftTree(
        tokens=torch.tensor([101, 32, 116, 104, 97, 120]), parents=(-1, -1, 0, 0, 1, 2)
    )
    with target.skip(skip):
        cache = target.new_cache()
        target.prefill(prefix, cache)
        P = prefix.numel()

        def verify(t: DraftTree) -> torch.Tensor:
            logits, _ = target.verify_forward(root, t, cache, P)
            keep_accepted(cache, P, len(t) + 1, [])  # roll back to the prefix
            return logits

        tree_logits = verify(tree)
        for node in range(len(tree)):
            path = [node]
            while tree.parents[path[-1]] != -1:
                path.append(tree.parents[path[-1]])
            chain = DraftTree.chain(tree.tokens[list(reversed(path))])
            chain_logits = verify(chain)
            torch.testing.assert_close(
                tree_logits[node + 1], chain_logits[-1], rtol=1e-9, atol=1e-9
            )
            torch.testing.assert_close(tree_logits[0], chain_logits[0], rtol=1e-9, atol=1e-9)
        causal_logits = verify(DraftTree.chain(tree.tokens))  # same slots, plain causal mask
    # Node 2 is a child of node 0; as a chain it would also see node 1 and sit one position later.
    off_path = [1, 2, 3, 4, 5]
    diffs = [(tree_logits[i + 1] - causal_logits[i + 1]).abs().max().item() for i in off_path]
    assert min(diffs) > 1e-3, diffs


# ----------------------------------------------------------------------------- registry
def _drafter_cfg(name: str, **overrides: object) -> dict:
    cfg = OmegaConf.load(REPO / "conf" / "drafter" / f"{name}.yaml")
    cfg = OmegaConf.merge(cfg, overrides)
    return OmegaConf.to_container(cfg)  # type: ignore[return-value]


def test_every_conf_file_is_registered() -> None:
    files = sorted(p.stem for p in (REPO / "conf" / "drafter").glob("*.yaml"))
    assert (
        files
        == available_drafters()
        == ["draft_model", "eagle", "merged", "pld", "routed", "samd", "self", "t2d", "token_recycle"]
    )
    for name in files:
        cfg = OmegaConf.load(REPO / "conf" / "drafter" / f"{name}.yaml")
        # Each builder lives in its drafter's module: the registry is a lookup.
        assert cfg.name == name and str(cfg._target_).startswith("tss_opt.decoding.drafters.")
        assert ".registry." not in str(cfg._target_)


@pytest.mark.parametrize(
    "name,overrides",
    [
        ("pld", {}),
        ("draft_model", {}),
        ("self", {"skip": [1, 2]}),
        ("token_recycle", {"template": "builtin:token_recycle_large.json"}),
        ("samd", {}),
        ("eagle", {"random_init": True}),
    ],
)
def test_build_every_drafter_from_conf(
    name: str,
    overrides: dict,
    tiny: LoadedModel,
    tiny_target: TargetModel,
    tiny_prompts: list[torch.Tensor],
) -> None:
    drafter = build_drafter(_drafter_cfg(name, **overrides), tiny_target, tiny)
    ids = tiny_prompts[0]
    got = SpeculativeEngine(tiny_target, drafter, eos_token_ids=[TINY_EOS]).generate(
        ids, max_new_tokens=16
    )
    assert got.tokens.tolist() == greedy_generate(tiny.model, ids, 16, TINY_EOS)


def test_registry_errors(tiny: LoadedModel, tiny_target: TargetModel) -> None:
    with pytest.raises(
        DrafterConfigError,
        match=r"unknown drafter 'medusa'.*draft_model, eagle, merged, pld, routed, samd, self, t2d, token_recycle",
    ):
        build_drafter({"name": "medusa"}, tiny_target, tiny)
    with pytest.raises(
        DrafterConfigError, match=r"does not take setting\(s\) num_token.*num_tokens"
    ):
        build_drafter({"name": "pld", "num_token": 3}, tiny_target, tiny)
    with pytest.raises(DrafterConfigError, match=r"'eagle' needs drafter.checkpoint"):
        build_drafter(_drafter_cfg("eagle"), tiny_target, tiny)  # checkpoint: ??? and random_init false
    with pytest.raises(ValueError, match=r"non-empty draft skip set \(drafter.skip\)"):
        build_drafter(_drafter_cfg("self"), tiny_target, tiny)  # skip: ???
    with pytest.raises(DrafterConfigError, match="cannot be imported"):
        build_drafter({"name": "x", "_target_": "tss_opt.nowhere.build"}, tiny_target, tiny)


# ----------------------------------------------------------------------------- embedded model
@pytest.fixture(scope="module")
def smol_prompt(embedded: LoadedModel) -> torch.Tensor:
    smol = embedded
    import json

    lines = (
        (REPO / "tss_opt" / "data" / "summarization.jsonl").read_text(encoding="utf-8").splitlines()
    )
    prompt = min(
        (json.loads(line)["prompt"] for line in lines), key=len
    )  # the shortest: a fast test
    text = smol.tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    return torch.tensor(smol.tokenizer(text, add_special_tokens=False).input_ids, dtype=torch.long)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,skip,scope",
    [
        ("token_recycle_15", frozenset(), "verify"),
        ("samd", frozenset({12, 13}), "verify"),
        ("eagle", frozenset({12, 13}), "all"),
    ],
)
def test_embedded_model_lossless(
    name: str, skip: frozenset[int], scope: str, embedded: LoadedModel, smol_prompt: torch.Tensor
) -> None:
    smol = embedded
    target = TargetModel(smol.model)
    eos = int(smol.tokenizer.convert_tokens_to_ids("<|im_end|>"))
    n = (
        12 if name == "eagle" else 24
    )  # a random head accepts ~nothing: every step verifies 59 nodes
    want = reference(target, smol_prompt, n, skip, scope, eos)
    rec = Recorder(DRAFTERS[name](smol.model))
    engine = SpeculativeEngine(target, rec, eos_token_ids=[eos])
    # Token Recycling's table starts cold and is kept across requests (its hot start): a
    # second request drafts full trees. EAGLE drafts full trees from the first step.
    for _ in range(1 if name == "eagle" else 2):
        got = engine.generate(smol_prompt, max_new_tokens=n, skip=skip, scope=scope)
        assert got.tokens.tolist() == want
    assert rec.branching >= 3, rec.sizes
    assert got.stats.accept_length >= 1.0
