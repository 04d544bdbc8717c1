"""Hardware-sized trees (decoding/sizing/): the choice is the argmax of the expected
rate, latency tables are measured and cached per key, profiles are measured from the engine's
own verification, and every chosen size keeps greedy outputs identical to plain decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tss_opt.decoding.drafters.token_recycle import TokenRecycleDrafter
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.sizing import (
    CONTEXT_BUCKETS,
    ENV_DIR,
    AcceptanceProfile,
    LatencyTable,
    TreeSizingError,
    best_tree,
    choose_tree,
    load_or_measure_latency,
    save_profile,
)
from tss_opt.decoding.sizing.choice import SPECULATION_MARGIN
from tss_opt.decoding.sizing.measure import AcceptanceCounter, measure_acceptance
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.tree import DraftTree
from tss_opt.models import LoadedModel

FLAT = AcceptanceProfile(rank_accept=((0.6, 0.3),), name="flat")


def test_hand_computed_argmax() -> None:
    # latency: plain 1.0 s, 1 node 1.2 s, 2 nodes 1.5 s; p(rank 0) = 0.6, p(rank 1) = 0.3.
    # none: 1/1.0 = 1.000; 1 node: 1.6/1.2 = 1.333;
    # 2 nodes: chain 1 + 0.6 + 0.36 = 1.96 -> 1.307; flat 1 + 0.6 + 0.3 = 1.9 -> 1.267.
    choice = choose_tree({0: 1.0, 1: 1.2, 2: 1.5}, FLAT, max_depth=4)
    assert choice.nodes == 1
    assert choice.expected_tokens == pytest.approx(1.6)
    assert choice.tokens_per_s == pytest.approx(1.6 / 1.2)
    rates = {(n, d): r for n, d, r in choice.candidates}
    assert rates[(0, 0)] == pytest.approx(1.0)
    assert rates[(2, 2)] == pytest.approx(1.96 / 1.5)  # the chain
    assert rates[(2, 1)] == pytest.approx(1.9 / 1.5)  # the flat tree
    assert max(rates.values()) == pytest.approx(choice.tokens_per_s)
    # With 2 nodes at 1.3 s the chain wins instead: 1.96/1.3 = 1.508 > 1.333.
    chain = choose_tree({0: 1.0, 1: 1.2, 2: 1.3}, FLAT, max_depth=4)
    assert chain.nodes == 2 and chain.template.parents == (-1, 0)


def test_proposal_rate_enters_the_rate_by_hand() -> None:
    # A chain drafter (rank 0 only, p = 0.6) that proposes at a share m of the steps; a step
    # without a proposal costs a plain step (1.0 s) and commits one token.
    # m = 1:   1 node 1.6/1.2 = 1.333 > 2-chain 1.96/1.5 = 1.307 -> 1 node.
    # m = 0.5: 1 node (1 + 0.5*0.6)/(0.5*1.2 + 0.5) = 1.3/1.1 = 1.1818;
    #          2-chain (1 + 0.5*0.96)/(0.5*1.5 + 0.5) = 1.48/1.25 = 1.184 -> the chain.
    # m = 0.2: 2-chain (1 + 0.2*0.96)/(0.2*1.5 + 0.8) = 1.192/1.10 = 1.0836, the best tree, but
    #          within SPECULATION_MARGIN (10 %) of plain decoding's 1.0 -> no speculation.
    lat = {0: 1.0, 1: 1.2, 2: 1.5}
    always = AcceptanceProfile(rank_accept=((0.6,),), name="chain")
    half = AcceptanceProfile(rank_accept=((0.6,),), name="chain", proposal_rate=0.5)
    rare = AcceptanceProfile(rank_accept=((0.6,),), name="chain", proposal_rate=0.2)
    assert choose_tree(lat, always, max_depth=4).nodes == 1
    choice = choose_tree(lat, half, max_depth=4)
    assert choice.nodes == 2 and choice.template.parents == (-1, 0)
    assert choice.expected_tokens == pytest.approx(1.48)
    assert choice.tokens_per_s == pytest.approx(1.48 / 1.25)
    assert SPECULATION_MARGIN == 0.10
    marginal = choose_tree(lat, rare, max_depth=4)
    assert marginal.nodes == 0 and marginal.tokens_per_s == pytest.approx(1.0)
    assert {(n, d): r for n, d, r in marginal.candidates}[(2, 2)] == pytest.approx(1.192 / 1.10)
    # Never proposing: every candidate is a plain step, and ties go to no speculation.
    never = AcceptanceProfile(rank_accept=((0.6,),), proposal_rate=0.0)
    assert choose_tree(lat, never, max_depth=4).nodes == 0
    with pytest.raises(TreeSizingError, match="proposal_rate=1.5"):
        AcceptanceProfile(rank_accept=((0.6,),), proposal_rate=1.5)
    # Saved and read back with the rate; files written before it existed read as 1.0.
    assert AcceptanceProfile.from_dict(rare.to_dict()) == rare
    assert AcceptanceProfile.from_dict({"rank_accept": [[0.6]]}).proposal_rate == 1.0


def test_counter_rates_shrink_sparse_cells_and_count_proposals() -> None:
    counter = AcceptanceCounter(max_depth=3, max_rank=1)
    vocab = 8

    def logits_for(next_tokens: list[int]) -> torch.Tensor:  # rows [root, node_0, ...]
        out = torch.zeros(len(next_tokens), vocab)
        out[torch.arange(len(next_tokens)), torch.tensor(next_tokens)] = 1.0
        return out

    chain = DraftTree(tokens=torch.tensor([1, 2, 3]), parents=(-1, 0, 1))
    # Step 1: whole chain accepted (target continues 1, 2, 3, then 4).
    counter.observe(chain, logits_for([1, 2, 3, 4]), accepted=[0, 1, 2])
    # Step 2: first node wrong (target wanted 5): only depth 1 is tried.
    counter.observe(chain, logits_for([5, 2, 3, 4]), accepted=[])
    # Steps 3-4: nothing proposed.
    empty = DraftTree(tokens=torch.tensor([], dtype=torch.long), parents=())
    counter.observe(empty, logits_for([0]), accepted=[])
    counter.observe(empty, logits_for([0]), accepted=[])
    prof = counter.profile(pseudo_trials=2.0)
    assert prof.proposal_rate == pytest.approx(2 / 4)
    # depth 1: 1 hit in 2 trials, shrunk towards 0 with 2 pseudo-trials: 1/4.
    # depth 2: 1/1, shrunk towards 0.25: (1 + 2*0.25)/3 = 0.5; depth 3: (1 + 2*0.5)/3.
    assert prof.p(1, 0) == pytest.approx(0.25)
    assert prof.p(2, 0) == pytest.approx(0.5)
    assert prof.p(3, 0) == pytest.approx(2 / 3)
    # No pseudo-trials: the raw rates.
    raw = counter.profile(pseudo_trials=0.0)
    assert [raw.p(d, 0) for d in (1, 2, 3)] == [0.5, 1.0, 1.0]


def test_no_speculation_wins_when_verification_costs_more_than_it_returns() -> None:
    # A CPU-like table: every node costs as much as the root itself.
    cpu = {n: 1.0 + n for n in (0, 1, 2, 4, 8, 16)}
    choice = choose_tree(cpu, FLAT, max_depth=8)
    assert choice.nodes == 0 and choice.tokens_per_s == pytest.approx(1.0)
    assert "no speculation" in choice.describe()


def test_wide_tree_wins_when_verification_is_flat() -> None:
    # A GPU-like table: 64 nodes cost 5% more than one token.
    gpu = {0: 1.0, 1: 1.0, 8: 1.01, 64: 1.05}
    prof = AcceptanceProfile(rank_accept=((0.6, 0.2, 0.1, 0.05),))
    choice = choose_tree(gpu, prof, max_depth=8)
    assert choice.nodes == 64
    assert choice.template.level_sizes()[0] > 1  # branching, not a chain
    # best_tree is optimal: no other 64-node candidate of any depth did better.
    assert all(r <= choice.tokens_per_s + 1e-12 for _, _, r in choice.candidates)


def test_best_tree_values_by_hand() -> None:
    tmpl, acc = best_tree(FLAT, 3, max_depth=2)
    # 0.6 (rank 0), then 0.36 (its rank-0 child), then 0.3 (root's rank 1) > 0.18.
    assert acc == pytest.approx(0.6 + 0.36 + 0.3)
    assert sorted(zip(tmpl.parents, tmpl.ranks)) == [(-1, 0), (-1, 1), (0, 0)]


def test_latency_table_interpolates_and_rejects_bad_tables() -> None:
    t = LatencyTable({0: 1.0, 4: 2.0, 8: 4.0})
    assert t.at(2) == pytest.approx(1.5)
    assert t.at(16) == pytest.approx(8.0)
    with pytest.raises(TreeSizingError, match="no 0"):
        LatencyTable({1: 1.0})
    # A padded step (a compiled target) costs its bucket's: 5 nodes fill the 8-slot bucket of 7.
    p = LatencyTable({0: 1.0, 1: 1.1, 3: 1.2, 7: 2.0, 15: 3.0}, padded=True)
    assert p.at(5) == p.at(7) == 2.0 and p.at(2) == 1.2 and p.at(16) == pytest.approx(3.125)
    assert LatencyTable.from_dict(p.to_dict()).padded and "padded" not in t.to_dict()
    with pytest.raises(TreeSizingError, match="depth 1 rank 0 has p=1.5"):
        AcceptanceProfile(rank_accept=((1.5,),))


@pytest.fixture(scope="module")
def target64(tiny64: LoadedModel) -> TargetModel:
    return TargetModel(tiny64.model)


def _prompts(n: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 200, (12,), generator=g) for _ in range(n)]


def test_latency_is_measured_once_and_cached(target64: TargetModel, tmp_path: Path) -> None:
    t1 = load_or_measure_latency(target64, tmp_path, sizes=(0, 1, 4))
    files = list(tmp_path.glob("latency-*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert set(data["key"]) == {"machine", "model", "dtype", "device"} and data["key"]["dtype"] == "float64"
    assert data["measured_at"].startswith("20") and set(data["seconds"]) == {"0", "1", "4"}
    t2 = load_or_measure_latency(target64, tmp_path, sizes=(0, 1, 4))
    assert t2.seconds == t1.seconds and t2.measured_at == t1.measured_at  # read, not re-measured
    assert data["cpus"] >= 1 and (data["load"] is None or data["load"] >= 0)  # the host's load, recorded
    assert (t2.load, t2.cpus) == (t1.load, t1.cpus)


def test_a_table_measured_on_a_busy_host_is_called_busy(target64: TargetModel, tmp_path: Path) -> None:
    # Warnings and measuring again: tests/decoding/test_busy_tables.py.
    t = load_or_measure_latency(target64, tmp_path, sizes=(0, 1))
    assert not LatencyTable(seconds=t.seconds, key=t.key, measured_at=t.measured_at, load=1.9, cpus=2).busy
    busy = LatencyTable(seconds=t.seconds, key=t.key, measured_at=t.measured_at, load=7.5, cpus=2)
    assert busy.busy and not LatencyTable(seconds=t.seconds, key=t.key).busy  # unrecorded load: not called busy


def test_profile_measured_from_the_engine(target64: TargetModel) -> None:
    wide = {"parents": [-1, -1, -1, 0, 0, 3], "ranks": [0, 1, 2, 0, 1, 0]}
    prof = measure_acceptance(target64, TokenRecycleDrafter(wide, top_k=4), _prompts(2),
                              max_new_tokens=24, max_depth=3, max_rank=3)
    assert len(prof.rank_accept) == 3
    assert all(0.0 <= p <= 1.0 for row in prof.rank_accept for p in row)
    # A warm Token Recycling table on a random model repeats itself: rank 0 hits sometimes.
    assert prof.p(1, 0) > 0.0


@pytest.mark.parametrize(
    "latency",
    [
        {0: 1.0, 1: 2.0, 2: 3.0},  # CPU-like: no speculation
        {0: 1.0, 1: 1.0, 2: 1.0},  # 1-2 nodes
        {0: 1.0, 4: 1.0, 16: 1.0},  # 16-node tree
    ],
)
def test_sized_drafter_is_lossless(target64: TargetModel, tmp_path: Path, latency: dict[int, float]) -> None:
    (tmp_path / "latency-x.json").write_text("{}")  # ignored: not this key
    # Seed this key's cache with a chosen table, so sized_to picks the size under test.
    _seed_latency(target64, tmp_path, latency)
    save_profile(AcceptanceProfile(rank_accept=((0.6, 0.3, 0.2, 0.1),)), "token_recycle", tmp_path)
    drafter = TokenRecycleDrafter.sized_to(target64, top_k=4, directory=tmp_path)
    assert drafter.choice is not None and len(drafter.template) == drafter.choice.nodes
    assert drafter.choice.nodes == max(latency) or (latency[1] > latency[0] and drafter.choice.nodes == 0)
    plain = SpeculativeEngine(target64)
    spec = SpeculativeEngine(target64, drafter)
    for prompt in _prompts():
        want = plain.generate(prompt, max_new_tokens=20).tokens
        got = spec.generate(prompt, max_new_tokens=20)
        assert torch.equal(got.tokens, want)


def _seed_latency(target: TargetModel, directory: Path, latency: dict[int, float]) -> None:
    """Every context bucket's table of this key := ``latency``."""
    for ctx in CONTEXT_BUCKETS:
        t = load_or_measure_latency(target, directory, sizes=(0, 1), prefix_len=ctx)
        for path in directory.glob("latency-*.json"):
            if path.name != "latency-x.json" and LatencyTable.from_dict(json.loads(path.read_text())).prefix_len == ctx:
                path.write_text(json.dumps(LatencyTable(seconds=latency, key=t.key, measured_at=t.measured_at, prefix_len=ctx).to_dict()))


@pytest.mark.parametrize("latency", [{0: 1e-3, 1: 1.0}, {0: 1.0, 8: 1.0, 16: 1.0}])
def test_sized_eagle_is_lossless_or_plain(
    tiny64: LoadedModel, target64: TargetModel, tmp_path: Path, latency: dict[int, float]
) -> None:
    from tss_opt.decoding.drafters.eagle import EagleDrafter, random_eagle_head, sized_eagle
    from tss_opt.decoding.engine import NoDrafter

    _seed_latency(target64, tmp_path, latency)
    save_profile(AcceptanceProfile(rank_accept=((0.6, 0.3, 0.2, 0.1),)), "eagle", tmp_path)
    drafter = sized_eagle(target64, random_eagle_head(tiny64.model, seed=0), depth=4, top_k=4, directory=tmp_path)
    if latency[0] < 0.01:  # verifying one node costs 1000 plain steps: nothing pays
        assert isinstance(drafter, NoDrafter) and drafter.choice.nodes == 0
        return
    assert isinstance(drafter, EagleDrafter) and drafter.total_tokens == 17
    plain, spec = SpeculativeEngine(target64), SpeculativeEngine(target64, drafter)
    for prompt in _prompts(2):
        assert torch.equal(spec.generate(prompt, max_new_tokens=16).tokens, plain.generate(prompt, max_new_tokens=16).tokens)


def test_registry_template_auto(tiny64: LoadedModel, target64: TargetModel, tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    from tss_opt.decoding.drafters import build_drafter

    monkeypatch.setenv(ENV_DIR, str(tmp_path))  # the cache folder (default ./storage/tree_sizing)
    _seed_latency(target64, tmp_path, {0: 1.0, 1: 5.0})
    d = build_drafter({"name": "token_recycle", "template": "auto"}, target64, tiny64)
    assert isinstance(d, TokenRecycleDrafter) and len(d.template) == 0 and d.choice is not None
    default = build_drafter({"name": "token_recycle"}, target64, tiny64)  # auto is the default
    assert len(default.template) == 0 and default.choice is not None
    fixed = build_drafter({"name": "token_recycle", "template": "builtin:token_recycle_15.json"}, target64, tiny64)
    assert fixed.template.name == "token_recycle_15" and fixed.choice is None


def test_samd_fallback_template_auto(tiny64: LoadedModel, target64: TargetModel, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from tss_opt.decoding.drafters import build_drafter

    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    _seed_latency(target64, tmp_path, {0: 1.0, 1: 1.0, 4: 1.0})
    d = build_drafter({"name": "samd"}, target64, tiny64)  # template: auto is the default
    assert isinstance(d.fallback, TokenRecycleDrafter) and len(d.fallback.template) == 4
    plain, spec = SpeculativeEngine(target64), SpeculativeEngine(target64, d)
    for prompt in _prompts(2):
        assert torch.equal(spec.generate(prompt, max_new_tokens=16).tokens, plain.generate(prompt, max_new_tokens=16).tokens)
