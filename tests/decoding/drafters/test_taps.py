"""TAPS drafters (``routed``, ``merged``): lossless, mask isolation, dedup, stats, errors.

Greedy decoding through either drafter must emit exactly the tokens of plain greedy decoding
of the same target (dense, and sparse under both scopes), in float64 and float32; references
come from ``tests/decoding/reference.py`` (no engine code).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from reference import greedy_dense_prefill, greedy_no_cache

from tss_opt.decoding.cache import keep_accepted
from tss_opt.decoding.drafter import Drafter, VerifyFeedback
from tss_opt.decoding.drafters import (
    DrafterCapabilities,
    DrafterConfigError,
    EagleDrafter,
    PromptLookupDrafter,
    SamdDrafter,
    TokenRecycleDrafter,
    build_drafter,
    random_eagle_head,
)
from tss_opt.decoding.drafters.taps import (
    MergedDrafter,
    RoutedDrafter,
    member_feedback,
    merge_trees,
)
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.tree import DraftTree
from tss_opt.models import LoadedModel, ModelConfig, load_model

REPO = Path(__file__).resolve().parents[3]
MAX_NEW = 40
CASES = [((), "verify"), ((1, 2), "verify"), ((0,), "all"), ((3,), "all")]
CASE_IDS = [f"{'-'.join(map(str, s)) or 'dense'}-{scope}" for s, scope in CASES]


@pytest.fixture(scope="module")
def tiny32() -> LoadedModel:
    return load_model(ModelConfig(name="tiny", source="tiny", num_layers=4, dtype="float32"))


def prompts(loaded: LoadedModel) -> list[torch.Tensor]:
    tok = loaded.tokenizer
    texts = [
        "the cat sat on the mat. the cat sat on the hat. the dog sat on the log. the cat",
        "Summarize: a b c d a b c d a b c e a b c d. Answer: a b",
    ]
    return [torch.tensor(tok(t, add_special_tokens=False).input_ids, dtype=torch.long) for t in texts]


def reference(model: torch.nn.Module, ids: torch.Tensor, skip: tuple[int, ...], scope: str) -> list[int]:
    if scope == "all":
        return greedy_no_cache(model, ids, MAX_NEW, skip)
    return greedy_dense_prefill(model, ids, MAX_NEW, skip)


def members(model: torch.nn.Module, eagle: bool = False) -> list[tuple[str, Drafter]]:
    out: list[tuple[str, Drafter]] = [
        ("pld", PromptLookupDrafter(num_tokens=6)),
        ("token_recycle", TokenRecycleDrafter("builtin:token_recycle_15.json")),
        ("samd", SamdDrafter(threshold=2, num_tokens=6)),
    ]
    if eagle:
        out.append(("eagle", EagleDrafter(random_eagle_head(model, seed=0), total_tokens=8, depth=3, top_k=3)))
    return out


class Counting(Drafter):
    """Wraps a drafter; counts accepted nodes and branching trees as the engine reports them."""

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.capabilities = inner.capabilities
        self.accepted = 0
        self.branching = 0

    def reset(self, prompt_ids: torch.Tensor) -> None:
        self.inner.reset(prompt_ids)

    def prefill_feedback(self, prompt_ids: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor) -> None:
        self.inner.prefill_feedback(prompt_ids, logits, hidden)

    def propose(self, context: torch.Tensor) -> DraftTree:
        tree = self.inner.propose(context)
        self.branching += any(len(k) > 1 for k in tree.children())
        return tree

    def update(self, feedback: VerifyFeedback) -> None:
        self.accepted += len(feedback.accepted)
        self.inner.update(feedback)


# ----------------------------------------------------------------------------- lossless
@pytest.mark.parametrize("skip,scope", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("kind", ["routed", "merged"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_taps_is_lossless(
    kind: str, dtype: str, skip: tuple[int, ...], scope: str, tiny: LoadedModel, tiny32: LoadedModel
) -> None:
    loaded = tiny if dtype == "float64" else tiny32
    cls = RoutedDrafter if kind == "routed" else MergedDrafter
    taps = cls(members(loaded.model, eagle=kind == "merged"))
    rec = Counting(taps)
    engine = SpeculativeEngine(TargetModel(loaded.model), rec)
    total_steps = 0
    for _ in range(2):  # the second pass drafts from a warm Token Recycling table
        for ids in prompts(loaded):
            got = engine.generate(ids, max_new_tokens=MAX_NEW, skip=skip, scope=scope)
            assert got.tokens.tolist() == reference(loaded.model, ids, skip, scope)
            total_steps += got.stats.steps
    # Statistics add up: the members' credited accepted tokens are all accepted tokens.
    stats = taps.member_stats()
    assert sum(s["accepted"] for s in stats.values()) == rec.accepted == taps.total_accepted
    assert taps.steps == total_steps
    assert rec.accepted > 0 and rec.branching > 0
    for s in stats.values():
        assert len(s["depth_verified"]) == len(s["depth_accepted"])
        assert all(a <= v for a, v in zip(s["depth_accepted"], s["depth_verified"], strict=True))
        assert s["depth_verified"][:1] == [s["routed"]] or s["routed"] == 0
    if kind == "routed":
        assert sum(s["routed"] for s in stats.values()) + taps.empty_steps == taps.steps
        # The credited tokens of the routed member are the depth reached in its tree.
        for s in stats.values():
            assert s["accepted"] == sum(s["depth_accepted"])
    else:
        assert stats["token_recycle"]["routed"] > 0 and stats["pld"]["routed"] > 0


@pytest.mark.parametrize("kind", ["routed", "merged"])
def test_taps_sampling_equals_plain_sampling(kind: str, tiny: LoadedModel) -> None:
    """Temperature > 0 with a seed: the coupled rule makes the output that of plain sampling."""
    target = TargetModel(tiny.model)
    cls = RoutedDrafter if kind == "routed" else MergedDrafter
    taps = cls(members(tiny.model))
    for ids in prompts(tiny):
        plain = SpeculativeEngine(target, None).generate(ids, max_new_tokens=24, temperature=0.7, seed=5)
        got = SpeculativeEngine(target, taps).generate(ids, max_new_tokens=24, temperature=0.7, seed=5)
        assert got.tokens.tolist() == plain.tokens.tolist()
    assert taps.steps > 0


# ----------------------------------------------------------------------------- merging
def _two_trees() -> tuple[DraftTree, DraftTree]:
    # Member 0: 5 -> 6 -> 7 and 5 -> 8; member 1: 5 -> 6 -> 9, 3 -> 4 (shares 5 -> 6).
    a = DraftTree(tokens=torch.tensor([5, 6, 7, 8]), parents=(-1, 0, 1, 0), confidence=torch.tensor([0.9, 0.5, 0.4, 0.1]))
    b = DraftTree(tokens=torch.tensor([5, 3, 6, 9, 4]), parents=(-1, -1, 0, 2, 1), confidence=torch.tensor([0.7, 0.2, 0.6, 0.3, 0.2]))
    return a, b


def test_merge_deduplicates_identical_paths() -> None:
    a, b = _two_trees()
    m = merge_trees([a, b])
    # Shared 5 and 5 -> 6: 9 member nodes become 7 merged nodes.
    assert len(m.tree) == 7 and m.deduplicated == 2
    assert m.tree.tokens.tolist() == [5, 6, 7, 8, 3, 9, 4]
    assert m.tree.parents == (-1, 0, 1, 0, -1, 1, 4)
    assert m.node_maps == ((0, 1, 2, 3), (0, 4, 1, 5, 6))
    assert m.owners == ((0, 1), (0, 1), (0,), (0,), (1,), (1,), (1,))
    assert m.tree.confidence.tolist() == pytest.approx([0.9, 0.6, 0.4, 0.1, 0.2, 0.3, 0.2])
    # Every root-to-node token path of every member is a path of the merged tree, once.
    def paths(t: DraftTree) -> set[tuple[int, ...]]:
        out: list[tuple[int, ...]] = []
        for i, p in enumerate(t.parents):
            out.append((out[p] if p >= 0 else ()) + (int(t.tokens[i]),))
        return set(out)

    assert paths(m.tree) == paths(a) | paths(b)
    assert len(paths(m.tree)) == len(m.tree)
    # Merging a tree with itself changes nothing; an empty member adds nothing.
    same = merge_trees([a, a, DraftTree.empty()])
    assert same.tree.tokens.tolist() == a.tokens.tolist() and same.tree.parents == a.parents
    assert same.deduplicated == len(a)


def test_merged_mask_isolates_subtrees() -> None:
    """Each merged node may attend only to the root and to nodes of its own member(s)."""
    a = DraftTree(tokens=torch.tensor([11, 12, 13, 14]), parents=(-1, 0, 0, 1))
    b = DraftTree(tokens=torch.tensor([21, 22, 23]), parents=(-1, 0, 1))
    c = DraftTree(tokens=torch.tensor([11, 31]), parents=(-1, 0))  # shares node 11 with a
    m = merge_trees([a, b, c])
    allowed = m.tree.ancestor_matrix()  # [root, node_0, ...]
    for j in range(len(m.tree)):
        cols = allowed[j + 1].nonzero().reshape(-1).tolist()
        assert cols[0] == 0  # the root
        for col in cols[1:]:
            # an ancestor (or itself) is proposed by a member that also proposed node j
            assert set(m.owners[col - 1]) >= set(m.owners[j]), (j, col - 1)
        # and its ancestors are exactly its member's path: never a node of another member
        others = [k for k in range(len(m.tree)) if not set(m.owners[k]) & set(m.owners[j])]
        assert not allowed[j + 1, [k + 1 for k in others]].any()


def test_merged_forward_equals_each_member_alone(tiny: LoadedModel) -> None:
    """One forward over the merged tree gives each member node the logits that verifying
    the member's tree alone gives (float64): the subtrees do not see each other."""
    target = TargetModel(tiny.model)
    ids = prompts(tiny)[0]
    prefix, root = ids[:-1], int(ids[-1])
    a, b = _two_trees()
    m = merge_trees([a, b])
    cache = target.new_cache()
    target.prefill(prefix, cache)
    P = prefix.numel()

    def verify(t: DraftTree) -> torch.Tensor:
        logits, _ = target.verify_forward(root, t, cache, P)
        keep_accepted(cache, P, len(t) + 1, [])
        return logits

    merged_logits = verify(m.tree)
    for member, tree in enumerate((a, b)):
        alone = verify(tree)
        rows = [0, *(j + 1 for j in m.node_maps[member])]
        torch.testing.assert_close(merged_logits[rows], alone, rtol=1e-9, atol=1e-9)


def test_member_feedback_maps_back_to_own_tree() -> None:
    a, b = _two_trees()
    m = merge_trees([a, b])
    n = len(m.tree)
    logits = torch.arange((n + 1) * 3, dtype=torch.float64).reshape(n + 1, 3)
    hidden = -logits
    # Accepted path 5 -> 6 -> 9 (merged nodes 0, 1, 5): inside b entirely, leaves a after 6.
    fb = VerifyFeedback(m.tree, (0, 1, 5), torch.tensor([5, 6, 9, 2]), logits, hidden, root_token=1)
    fa = member_feedback(fb, m, 0, a)
    assert fa.tree.tokens.tolist() == [5, 6, 7, 8, 9] and fa.tree.parents == (-1, 0, 1, 0, 1)
    assert fa.accepted == (0, 1, 4)
    assert fa.logits.tolist() == logits[[0, 1, 2, 3, 4, 6]].tolist()
    assert torch.equal(fa.hidden, -fa.logits)
    fbb = member_feedback(fb, m, 1, b)
    assert fbb.tree.tokens.tolist() == b.tokens.tolist() and fbb.accepted == (0, 2, 3)
    assert fbb.logits.tolist() == logits[[0, 1, 5, 2, 6, 7]].tolist()
    # A member that proposed nothing gets the accepted path as its chain.
    empty_m = merge_trees([a, DraftTree.empty()])
    fb2 = VerifyFeedback(empty_m.tree, (0, 1), torch.tensor([5, 6, 2]), logits[:5], hidden[:5], 1)
    fe = member_feedback(fb2, empty_m, 1, DraftTree.empty())
    assert fe.tree.tokens.tolist() == [5, 6] and fe.tree.parents == (-1, 0) and fe.accepted == (0, 1)


# ----------------------------------------------------------------------------- errors, config
class NoConfidence(Drafter):
    def propose(self, context: torch.Tensor) -> DraftTree:
        return DraftTree.chain(context[-2:])


def test_routed_refuses_member_without_confidences(tiny: LoadedModel) -> None:
    with pytest.raises(DrafterConfigError, match=r"routed needs per-node confidences.*'mine' \(NoConfidence\)"):
        RoutedDrafter([("pld", PromptLookupDrafter()), ("mine", NoConfidence())])
    # A member that claims confidences but proposes a tree without them: named at the step.
    liar = NoConfidence()
    liar.capabilities = DrafterCapabilities(confidence=True)
    routed = RoutedDrafter([("pld", PromptLookupDrafter()), ("liar", liar)])
    with pytest.raises(DrafterConfigError, match=r"member 'liar' proposed a tree without confidences"):
        routed.propose(torch.tensor([1, 2, 3, 4]))
    # merged needs no confidences
    MergedDrafter([("pld", PromptLookupDrafter()), ("mine", NoConfidence())])


def test_routed_picks_highest_mean_confidence() -> None:
    class Fixed(Drafter):
        capabilities = DrafterCapabilities(confidence=True)

        def __init__(self, tree: DraftTree) -> None:
            self.tree = tree

        def propose(self, context: torch.Tensor) -> DraftTree:
            return self.tree

    a, b = _two_trees()  # mean confidence 0.475 and 0.4
    r = RoutedDrafter([("b", Fixed(b)), ("a", Fixed(a)), ("none", Fixed(DraftTree.empty()))])
    assert r.propose(torch.tensor([1])) is a
    r2 = RoutedDrafter([("a1", Fixed(a)), ("a2", Fixed(a))])
    r2.propose(torch.tensor([1]))
    assert r2._chosen == 0  # ties: the member listed first


def _conf(name: str, **over: object) -> dict:
    cfg = OmegaConf.merge(OmegaConf.load(REPO / "conf" / "drafter" / f"{name}.yaml"), over)
    return OmegaConf.to_container(cfg)  # type: ignore[return-value]


@pytest.mark.parametrize("kind", ["routed", "merged"])
def test_build_from_conf(kind: str, tiny: LoadedModel) -> None:
    target = TargetModel(tiny.model)
    d = build_drafter(_conf(kind), target, tiny)
    assert [n for n, _ in d.members] == ["pld", "token_recycle"]
    ids = prompts(tiny)[1]
    got = SpeculativeEngine(target, d).generate(ids, max_new_tokens=16)
    assert got.tokens.tolist() == greedy_dense_prefill(tiny.model, ids, 16)
    labelled = {"members": [{"name": "pld", "label": "pld3"}, {"name": "pld", "num_tokens": 4}]}
    assert [n for n, _ in build_drafter(_conf(kind, **labelled), target, tiny).members] == ["pld3", "pld"]


def test_config_errors(tiny: LoadedModel) -> None:
    target = TargetModel(tiny.model)
    with pytest.raises(DrafterConfigError, match=r"'routed' needs drafter.members"):
        build_drafter({"name": "routed", "members": []}, target, tiny)
    with pytest.raises(DrafterConfigError, match=r"pld used more than once; give each a distinct 'label'"):
        build_drafter({"name": "merged", "members": [{"name": "pld"}, {"name": "pld"}]}, target, tiny)
    with pytest.raises(DrafterConfigError, match=r"member 1 is 'routed'"):
        build_drafter({"name": "merged", "members": [{"name": "pld"}, {"name": "routed"}]}, target, tiny)
    with pytest.raises(DrafterConfigError, match=r"does not take setting\(s\) num_token"):
        build_drafter({"name": "routed", "members": [{"name": "pld", "num_token": 3}]}, target, tiny)
