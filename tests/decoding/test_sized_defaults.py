"""Hardware sizing is the default of every tree drafter: the shipped configs
build sized drafters, the chain length of prompt lookup is the argmax of the expected rate, the
choice is a deterministic function of the cached inputs (replay == engine), and greedy outputs
stay identical to plain decoding for every drafter, sized and at fixed sizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tss_opt.config.drafters import DrafterConfigError
from tss_opt.decoding.drafters import build_drafter
from tss_opt.decoding.drafters.prompt_lookup import PromptLookupDrafter
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.sizing import (
    CONTEXT_BUCKETS,
    ENV_DIR,
    AcceptanceProfile,
    ContextSized,
    LatencyTable,
    OnlineChain,
    choose_tree,
    load_or_measure_draft_cost,
    load_or_measure_latency,
    load_profile,
    save_profile,
    sized_chain,
)
from tss_opt.decoding.target import TargetModel
from tss_opt.models import LoadedModel

CPU_LIKE = {0: 1.0, 1: 2.0, 4: 5.0, 16: 17.0}  # every node costs a plain step: nothing pays
FLAT = {0: 1.0, 1: 1.0, 4: 1.0, 16: 1.05}  # a GPU-like table: wide trees pay


@pytest.fixture(scope="module")
def target64(tiny64: LoadedModel) -> TargetModel:
    return TargetModel(tiny64.model)


def _seed(target: TargetModel, directory: Path, latency: dict[int, float],
          long: dict[int, float] | None = None) -> None:
    """This key's latency tables := ``latency`` (``long``, when given, for contexts beyond 64
    tokens); profiles for every sized drafter."""
    for ctx in CONTEXT_BUCKETS:
        t = load_or_measure_latency(target, directory, sizes=(0, 1), prefix_len=ctx)
        for path in directory.glob("latency-*.json"):
            table = LatencyTable.from_dict(json.loads(path.read_text()))
            if table.prefix_len == ctx:
                secs = latency if ctx == 64 or long is None else long
                path.write_text(json.dumps(LatencyTable(seconds=secs, key=t.key, measured_at=t.measured_at, prefix_len=ctx).to_dict()))
    prof = AcceptanceProfile(rank_accept=((0.6, 0.3, 0.2, 0.1),))
    for name in ("token_recycle", "eagle"):
        save_profile(prof, name, directory)
    save_profile(AcceptanceProfile(rank_accept=((0.6,), (0.8,))), "pld", directory)


def _prompts(n: int = 2) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    # A repeated span, so prompt lookup and SAMD find matches.
    out = []
    for _ in range(n):
        span = torch.randint(0, 200, (6,), generator=g)
        out.append(torch.cat([span, torch.randint(0, 200, (4,), generator=g), span]))
    return out


def _shipped(cfg: dict[str, Any]) -> Any:
    """The shipped ``conf/drafter/<name>.yaml`` with ``cfg`` merged in (TAPS members live there)."""
    from omegaconf import OmegaConf

    from tss_opt.config import config_dir

    return OmegaConf.merge(OmegaConf.load(config_dir() / "drafter" / f"{cfg['name']}.yaml"), cfg)


def _lossless(target: TargetModel, drafter: Any, new_tokens: int = 16) -> None:
    plain, spec = SpeculativeEngine(target), SpeculativeEngine(target, drafter)
    for prompt in _prompts():
        want = plain.generate(prompt, max_new_tokens=new_tokens).tokens
        assert torch.equal(spec.generate(prompt, max_new_tokens=new_tokens).tokens, want)


def test_chain_length_is_the_argmax_by_hand() -> None:
    # p(depth 1) = 0.6, p(depth >= 2) = 0.8 (conditional). Expected tokens for a chain of n:
    # 1 + 0.6 (1 + 0.8 + ... + 0.8^(n-1)): n=1 1.6, n=2 2.08, n=3 2.464.
    # Latency 0: 1.0, 1: 1.5, 2: 1.6, 3: 2.0 -> rates 1.0, 1.067, 1.300, 1.232: n = 2.
    prof = AcceptanceProfile(rank_accept=((0.6,), (0.8,)))
    choice = choose_tree({0: 1.0, 1: 1.5, 2: 1.6, 3: 2.0}, prof, sizes=range(1, 4), max_depth=3)
    assert choice.nodes == 2 and choice.template.parents == (-1, 0)
    assert choice.expected_tokens == pytest.approx(2.08)
    rates = {(n, d): r for n, d, r in choice.candidates}
    assert rates[(3, 3)] == pytest.approx(2.464 / 2.0) and rates[(1, 1)] == pytest.approx(1.6 / 1.5)
    # Verification twice as dear: no length pays.
    assert choose_tree({0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}, prof, sizes=range(1, 4), max_depth=3).nodes == 0


def test_pld_auto_is_sized(target64: TargetModel, tiny64: LoadedModel, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    """pld's default stays the fixed chain of 10 (the search's protocol); auto sizes it (per
    step from the request's acceptance, test_online_chain.py; ``adapt: false``: per context)."""
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    _seed(target64, tmp_path, {0: 1.0, 1: 1.5, 2: 1.6, 3: 2.0, 10: 9.0})
    assert build_drafter({"name": "pld"}, target64, tiny64).num_tokens == 10
    assert isinstance(build_drafter({"name": "pld", "num_tokens": "auto"}, target64, tiny64).online, OnlineChain)
    d = build_drafter({"name": "pld", "num_tokens": "auto", "adapt": False}, target64, tiny64)
    assert isinstance(d, PromptLookupDrafter) and d.num_tokens == 2 and d.choice is not None
    assert d.num_tokens == sized_chain(target64, load_profile("pld"), max_tokens=10).nodes
    assert build_drafter({"name": "pld", "num_tokens": 7}, target64, tiny64).num_tokens == 7  # fixed
    _seed(target64, tmp_path, CPU_LIKE)
    off = build_drafter({"name": "pld", "num_tokens": "auto", "adapt": False}, target64, tiny64)
    assert off.num_tokens == 0 and len(off.propose(torch.tensor([1, 2, 1, 2, 1]))) == 0  # no speculation
    assert off.capabilities.replayable and off.capabilities.confidence  # still a TAPS member


def test_pld_auto_sizes_the_chain_for_the_context(target64: TargetModel, tiny64: LoadedModel, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A node that is cheap after 64 tokens is dear after 1,000 (this CPU, float32: 2-5 % of
    a plain step against 25 %): the chain is chosen per context bucket, stays lossless, and
    proposals remain a function of the context alone."""
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    # Short contexts: chain of 2 (the hand-computed case above). Long: every node costs a
    # plain step, so nothing pays.
    _seed(target64, tmp_path, {0: 1.0, 1: 1.5, 2: 1.6, 3: 2.0, 10: 9.0}, long=CPU_LIKE)
    d = build_drafter({"name": "pld", "num_tokens": "auto", "adapt": False}, target64, tiny64)
    assert isinstance(d.sizer, ContextSized) and sorted(d.sizer.choices) == list(CONTEXT_BUCKETS)
    assert [d.sizer(n) for n in (10, 64, 65, 256, 1000, 5000)] == [2, 2, 0, 0, 0, 0]
    assert d.num_tokens == 2 and "context <= 1024: no speculation" in d.sizer.describe()
    short = torch.tensor([5, 6, 7, 8, 5, 6])
    assert d.propose(short).tokens.tolist() == [7, 8]  # 2 of the 4 tokens a match offers
    long = torch.cat([torch.arange(100) % 50, short])  # 106 tokens: the 256 bucket
    assert len(d.propose(long)) == 0
    _lossless(target64, d)
    # Each bucket's table is its own file, with the context it was measured on.
    tables = {LatencyTable.from_dict(json.loads(p.read_text())).prefix_len for p in tmp_path.glob("latency-*.json")}
    assert tables == set(CONTEXT_BUCKETS)


@pytest.mark.parametrize("bad", [-1, 0, "ten", 2.5])
def test_bad_size_setting_names_value_and_fix(target64: TargetModel, tiny64: LoadedModel, bad: Any) -> None:
    with pytest.raises(DrafterConfigError, match=rf"num_tokens={bad!r}.*positive integer, or 'auto'"):
        build_drafter({"name": "pld", "num_tokens": bad}, target64, tiny64)


def test_choice_is_a_function_of_the_cached_inputs(target64: TargetModel, tiny64: LoadedModel, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Two builds (the engine's, the replay evaluator's) choose the same tree; EAGLE's cost per
    level is measured once and cached, never re-measured per build."""
    import tss_opt.decoding.drafters.eagle as eagle

    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    _seed(target64, tmp_path, FLAT)
    cfg = {"name": "eagle", "random_init": True, "depth": 3, "top_k": 4}
    first = build_drafter(cfg, target64, tiny64)
    assert len(list(tmp_path.glob("draft-eagle_level_d3_k4-*.json"))) == 1

    def boom(*a: Any, **k: Any) -> float:
        raise AssertionError("EAGLE's level cost was measured again instead of read from the cache")

    monkeypatch.setattr(eagle, "draft_seconds_per_level", boom)
    second = build_drafter(cfg, target64, tiny64)
    assert first.choice.template == second.choice.template and first.total_tokens == second.total_tokens
    for spec in ({"name": "token_recycle"}, {"name": "pld", "num_tokens": "auto", "adapt": False}, {"name": "samd"}):
        a, b = build_drafter(dict(spec), target64, tiny64), build_drafter(dict(spec), target64, tiny64)
        ca = getattr(a, "choice", None) or a.fallback.choice
        cb = getattr(b, "choice", None) or b.fallback.choice
        assert ca.template == cb.template


DEFAULTS = [
    {"name": "pld", "num_tokens": "auto"},
    {"name": "token_recycle"},
    {"name": "samd"},
    {"name": "merged"},
    {"name": "routed"},
    {"name": "eagle", "random_init": True, "depth": 3, "top_k": 4},
]


@pytest.mark.parametrize("latency", [CPU_LIKE, FLAT], ids=["cpu_like", "flat"])
@pytest.mark.parametrize("cfg", DEFAULTS, ids=[c["name"] for c in DEFAULTS])
def test_every_default_drafter_is_lossless(target64: TargetModel, tiny64: LoadedModel, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch, cfg: dict[str, Any],
                                           latency: dict[int, float]) -> None:
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    _seed(target64, tmp_path, latency)
    drafter = build_drafter(_shipped(cfg), target64, tiny64)
    parts = [d for _, d in getattr(drafter, "members", [])] or [getattr(drafter, "fallback", drafter)]
    # pld members keep their fixed default chain (the search's protocol); the others are sized
    # (pld auto per step from its request's acceptance: its first choice comes from the profile)
    nodes = [p.choice.nodes for p in parts if getattr(p, "choice", None) is not None]
    online = [p.online for p in parts if getattr(p, "online", None) is not None]
    nodes += [o.length(torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6, 7])) for o in online]
    assert nodes, f"no part of {cfg['name']} was sized to the hardware"
    # CPU-like: every sized part turned speculation off; flat: every part speculates.
    assert all(n == 0 for n in nodes) if latency is CPU_LIKE else all(n > 0 for n in nodes)
    _lossless(target64, drafter)


FIXED = [
    {"name": "pld", "num_tokens": 1},
    {"name": "pld", "num_tokens": 10},
    {"name": "token_recycle", "template": "builtin:token_recycle_15.json"},
    {"name": "token_recycle", "template": "builtin:token_recycle_large.json"},
    {"name": "samd", "template": "builtin:token_recycle_15.json"},
    {"name": "merged", "members": [{"name": "pld", "num_tokens": 4},
                                   {"name": "token_recycle", "template": "builtin:token_recycle_15.json"}]},
    {"name": "eagle", "random_init": True, "total_tokens": 4, "depth": 2, "top_k": 4},
    {"name": "eagle", "random_init": True, "total_tokens": 24, "depth": 4, "top_k": 4},
]


@pytest.mark.parametrize("cfg", FIXED, ids=lambda c: "-".join(str(v) for v in c.values())[:40])
def test_fixed_sizes_stay_lossless(target64: TargetModel, tiny64: LoadedModel, cfg: dict[str, Any]) -> None:
    _lossless(target64, build_drafter(_shipped(cfg), target64, tiny64))


# ------------------------------------------------------------ model-drafted chains (on request)
def test_model_chain_length_is_the_argmax_by_hand(target64: TargetModel, tmp_path: Path) -> None:
    """A chain of k costs k draft forwards plus the verification of k nodes. p = 0.6 then 0.8;
    0.1 s per drafted token; latency 0: 1.0, 1: 1.1, 2: 1.2, 3: 1.3, 4: 2.0 (5+ extrapolated):
    rates k=1 1.6/1.2 = 1.333, k=2 2.08/1.4 = 1.486, k=3 2.464/1.6 = 1.540, k=4 2.771/2.4 = 1.155."""
    from tss_opt.decoding.drafters.draft_model import sized_model_chain

    _seed(target64, tmp_path, {0: 1.0, 1: 1.1, 2: 1.2, 3: 1.3, 4: 2.0})
    save_profile(AcceptanceProfile(rank_accept=((0.6,), (0.8,))), "self", tmp_path)
    assert load_or_measure_draft_cost(target64, "hand", lambda: 0.1, tmp_path) == 0.1
    prof = load_profile("self", directory=tmp_path)
    choice = sized_chain(target64, prof, max_tokens=8, token_s=0.1, directory=tmp_path)
    assert choice.nodes == 3 and choice.template.parents == (-1, 0, 1)
    assert choice.step_s == pytest.approx(0.3 + 1.3) and choice.expected_tokens == pytest.approx(2.464)
    rates = {n: r for n, d, r in choice.candidates if n == d}  # chains: depth cap = size
    assert rates[2] == pytest.approx(2.08 / 1.4) and rates[4] == pytest.approx(2.7712 / 2.4)

    built: list[int] = []

    def make(k: int) -> Any:
        built.append(k)
        return PromptLookupDrafter(num_tokens=k)  # any drafter: only its construction is checked

    # The cached cost is read, never measured again; every bucket (same table) chooses 3.
    drafter = sized_model_chain(target64, "self", make, cost_name="hand", max_tokens=8, directory=tmp_path)
    assert built == [3] and [drafter.sizer(n) for n in CONTEXT_BUCKETS] == [3, 3, 3]
    # A draft model that costs as much as a verification step: no chain pays anywhere.
    load_or_measure_draft_cost(target64, "dear", lambda: 1.0, tmp_path)
    from tss_opt.decoding.drafter import NoDrafter

    off = sized_model_chain(target64, "self", make, cost_name="dear", max_tokens=8, directory=tmp_path)
    assert isinstance(off, NoDrafter) and off.choice is not None and off.choice.nodes == 0 and built == [3]


MODEL_CHAINS = [
    {"name": "self", "skip": [1, 2], "num_tokens": "auto"},
    {"name": "draft_model", "num_tokens": "auto"},
]


@pytest.mark.parametrize("latency", [CPU_LIKE, FLAT], ids=["cpu_like", "flat"])
@pytest.mark.parametrize("cfg", MODEL_CHAINS, ids=[c["name"] for c in MODEL_CHAINS])
def test_model_chain_auto_is_sized_and_lossless(target64: TargetModel, tiny64: LoadedModel, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch, cfg: dict[str, Any],
                                                latency: dict[int, float]) -> None:
    from tss_opt.decoding.drafter import NoDrafter
    from tss_opt.decoding.drafters.draft_model import DraftModelDrafter

    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    _seed(target64, tmp_path, latency)  # no profile for these: the model-chain prior
    drafter = build_drafter(_shipped(cfg), target64, tiny64)
    if latency is CPU_LIKE:
        assert isinstance(drafter, NoDrafter) and drafter.choice.nodes == 0
    else:  # verification is flat and the tiny draft forward costs ~1e-3 of a 1 s step: the longest chain
        assert isinstance(drafter, DraftModelDrafter) and drafter.num_tokens == 8 == drafter.choice.nodes
    assert len(list(tmp_path.glob(f"draft-{cfg['name']}_*_token-*.json"))) == 1  # measured once, cached
    again = build_drafter(_shipped(cfg), target64, tiny64)
    assert again.choice.template == drafter.choice.template
    _lossless(target64, drafter)
    assert build_drafter(_shipped({**cfg, "num_tokens": 3}), target64, tiny64).num_tokens == 3  # fixed


def test_self_auto_refuses_an_empty_skip_set_before_measuring(target64: TargetModel, tiny64: LoadedModel,
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    with pytest.raises(DrafterConfigError, match=r"non-empty draft skip set \(drafter.skip\)"):
        build_drafter(_shipped({"name": "self", "skip": [], "num_tokens": "auto"}), target64, tiny64)
    assert not list(tmp_path.glob("*.json"))  # nothing measured


# ------------------------------------------------------------ every sized drafter, per context
PER_CONTEXT = [
    {"name": "token_recycle"},
    {"name": "samd"},
    {"name": "eagle", "random_init": True, "depth": 3, "top_k": 4},
    {"name": "self", "skip": [1, 2]},
    {"name": "draft_model"},
    {"name": "pld", "num_tokens": "auto"},
]


@pytest.mark.parametrize("cfg", PER_CONTEXT, ids=[c["name"] for c in PER_CONTEXT])
def test_every_sized_default_drafts_per_context(target64: TargetModel, tiny64: LoadedModel, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch, cfg: dict[str, Any]) -> None:
    """Trees are cheap after 64 cached tokens and dear beyond (as on this CPU): every drafter
    that sizes (its shipped default) drafts on a short context, proposes nothing on a long
    one, and stays lossless on both."""
    from tss_opt.decoding.sizing import RANK_PRIOR

    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    _seed(target64, tmp_path, FLAT, long=CPU_LIKE)
    for name in ("samd", "self", "draft_model"):  # confident chains: the flat table pays for them
        save_profile(AcceptanceProfile(rank_accept=((0.9,),)), name, tmp_path)
    save_profile(AcceptanceProfile(rank_accept=RANK_PRIOR), "token_recycle", tmp_path)
    drafter = build_drafter(_shipped(cfg), target64, tiny64)
    sizers = [p.sizer for p in (drafter, getattr(drafter, "fallback", None)) if getattr(p, "sizer", None)]
    # pld auto and SAMD's match chain choose per step (test_online_chain.py), from the same tables
    assert sizers or drafter.online is not None, f"{cfg['name']}'s shipped default is not sized"
    for sizer in sizers:
        assert sorted(sizer.choices) == list(CONTEXT_BUCKETS)
        assert sizer.nodes(64) > 0 and sizer.nodes(65) == sizer.nodes(1000) == 0, sizer.describe()
    span = torch.arange(12) % 6 + 3  # repeats: prompt lookup and SAM find matches
    short, long = span, torch.cat([torch.arange(300) % 97 + 10, span])
    engine = SpeculativeEngine(target64, drafter)
    plain = SpeculativeEngine(target64)
    for prompt, drafts in ((short, True), (long, False)):
        out = engine.generate(prompt, max_new_tokens=12)
        assert torch.equal(out.tokens, plain.generate(prompt, max_new_tokens=12).tokens)
        assert (out.stats.draft_proposed > 0) == drafts, (cfg["name"], prompt.numel(), out.stats)
