"""Copy chains sized per step from the request's own acceptance (``adapt: true``): the scores
are the prefixes the target would have accepted, a request that copies turns speculation on
where the calibrated profile alone kept it off (and one that does not stays off), and prompt
lookup with it stays lossless and replayable; Token Recycling's steps are gated on its request's
rank-0 acceptance the same way."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_sized_defaults import (  # tests/decoding: the sized drafters' fixtures
    CPU_LIKE,
    FLAT,
    _lossless,
    _seed,
)

from tss_opt.config.drafters import DrafterConfigError
from tss_opt.decoding.drafters import build_drafter
from tss_opt.decoding.drafters.token_recycle import TokenRecycleDrafter
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.sizing import ENV_DIR, AcceptanceProfile, LatencyTable, OnlineChain
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.templates import TreeTemplate
from tss_opt.evaluation.replay import replay_stats
from tss_opt.models import LoadedModel

# A CPU without AMX (the 2026-12-05 EPYC, bfloat16 compiled): any draft costs ~1.4x a plain
# step, a chain of 10 about 2.2x, so only a request that copies pays.
DEAR = {0: 1.0, 1: 1.4, 2: 1.45, 4: 1.7, 8: 2.1, 16: 3.0}
LOW = AcceptanceProfile(rank_accept=((0.3,), (0.5,)), name="low")


@pytest.fixture(scope="module")
def target64(tiny64: LoadedModel) -> TargetModel:
    return TargetModel(tiny64.model)


def _chain(prior: AcceptanceProfile = LOW, table: dict[int, float] = DEAR, **kw: float) -> OnlineChain:
    return OnlineChain({64: LatencyTable(seconds=table)}, prior, max_tokens=10, **kw)


def test_scores_are_the_prefixes_the_target_would_have_accepted() -> None:
    chain = _chain()
    ctx = torch.tensor([1, 2, 3, 4])
    chain.length(ctx, torch.tensor([5, 6, 7, 8]))  # proposed after position 4: nothing known yet
    assert chain.reached == [0] * 10 and chain.hits == [0] * 10
    # The target commits 5, 6, 9: the proposal's first two tokens matched, the third did not.
    ctx = torch.tensor([1, 2, 3, 4, 5, 6, 9])
    chain.length(ctx, torch.tensor([2, 3]))
    assert chain.reached[:4] == [1, 1, 1, 0] and chain.hits[:4] == [1, 1, 0, 0]
    # The second proposal (2, 3 after position 7) is scored token by token as tokens arrive.
    chain.length(torch.tensor([1, 2, 3, 4, 5, 6, 9, 2]), torch.tensor([]))
    assert chain.reached[:3] == [2, 1, 1] and chain.hits[:3] == [2, 1, 0]
    chain.length(torch.tensor([1, 2, 3, 4, 5, 6, 9, 2, 3]), torch.tensor([]))
    assert chain.reached[:3] == [2, 2, 1] and chain.hits[:3] == [2, 2, 0]
    # Posterior means with the prior worth two proposals: depth 1: (2 + 2 * 0.3) / (2 + 2).
    assert chain.accept()[0] == pytest.approx(2.6 / 4) and chain.accept()[2] == pytest.approx((0 + 1.0) / 3)
    chain.reset()
    assert chain.reached == [0] * 10 and chain.accept()[0] == pytest.approx(0.3)


def test_a_request_that_copies_turns_speculation_on_and_one_that_does_not_stays_off() -> None:
    """With the low prior nothing pays on the dear table; a request whose proposals keep
    matching earns chains within a few steps, one whose proposals never match never drafts."""
    copying, never = _chain(), _chain()
    text = list(range(100, 140))
    for t in range(10, 30):  # the target's output is the text itself: every proposal matches
        copying.length(torch.tensor(text[:t]), torch.tensor(text[t:t + 10]))
        never.length(torch.tensor(text[:t]), torch.tensor([7] * 10))  # never the next token
    assert copying.chosen[0] == 0 and copying.chosen[-1] == 10 and sorted(copying.chosen) == copying.chosen
    assert never.chosen == [0] * 20
    # A cheap table (a GPU, or AMX on short contexts): the same low prior drafts from the start.
    assert _chain(table=FLAT).length(torch.tensor(text[:10]), torch.tensor(text[10:20])) > 0


def test_a_step_takes_the_argmax_by_hand() -> None:
    # Prior 0.6 then 0.8, no observations yet: expected tokens 1.6, 2.08, 2.464 for lengths
    # 1-3; latency 1.5, 1.6, 2.0: rates 1.067, 1.300, 1.232 against 1.0 plain: a chain of 2.
    prof = AcceptanceProfile(rank_accept=((0.6,), (0.8,)))
    chain = OnlineChain({64: LatencyTable(seconds={0: 1.0, 1: 1.5, 2: 1.6, 3: 2.0})}, prof, max_tokens=3)
    assert chain.length(torch.tensor([1, 2]), torch.tensor([3, 4, 5])) == 2
    # The proposal holds one token: a chain of 1 promises 1.067x, inside the 10 % margin.
    assert chain.length(torch.tensor([1, 2, 9]), torch.tensor([3])) == 0


def test_the_bucket_of_the_context_decides() -> None:
    high = AcceptanceProfile(rank_accept=((0.9,),))
    chain = OnlineChain({64: LatencyTable(seconds=FLAT), 1024: LatencyTable(seconds=CPU_LIKE)}, high, max_tokens=4)
    assert chain.length(torch.arange(50), torch.arange(4)) == 4
    assert chain.length(torch.arange(500), torch.arange(4)) == 0  # every node costs a plain step there


ADAPTED = [
    {"name": "pld", "num_tokens": "auto", "adapt": True},
    {"name": "samd", "adapt": True, "fallback": "none"},  # SAM decoding alone: replayable
]


@pytest.mark.parametrize("latency", [CPU_LIKE, FLAT], ids=["cpu_like", "flat"])
@pytest.mark.parametrize("cfg", ADAPTED, ids=["pld", "samd"])
def test_adapted_chains_are_lossless_and_replay_the_engine(target64: TargetModel, tiny64: LoadedModel, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch, latency: dict[int, float],
                                                           cfg: dict[str, object]) -> None:
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    _seed(target64, tmp_path, latency)
    drafter = build_drafter(dict(cfg), target64, tiny64)
    assert isinstance(drafter.online, OnlineChain) and drafter.sizer is None
    assert drafter.capabilities.replayable
    _lossless(target64, drafter, new_tokens=24)
    prompt = torch.cat([torch.arange(20, 40), torch.arange(20, 40)])  # copies itself: matches at every step
    res = SpeculativeEngine(target64, drafter).generate(prompt, max_new_tokens=24)
    again = replay_stats(build_drafter(dict(cfg), target64, tiny64), prompt, res.tokens.tolist(), max_new_tokens=24)
    got = (again.steps, again.new_tokens, again.draft_proposed, again.draft_accepted)
    assert got == (res.stats.steps, res.stats.new_tokens, res.stats.draft_proposed, res.stats.draft_accepted)
    assert drafter.online.chosen  # it saw proposals and chose lengths


def test_samd_adapted_hands_short_chains_to_its_fallback(target64: TargetModel, tiny64: LoadedModel, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no match chain pays, the Token Recycling fallback drafts (as with a sized 0)."""
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    _seed(target64, tmp_path, FLAT)
    drafter = build_drafter({"name": "samd", "adapt": True}, target64, tiny64)
    drafter.online.margin = 1e9  # no chain can promise that much: every match goes to the fallback
    prompt = torch.cat([torch.arange(20, 40), torch.arange(20, 40)])  # a match of 20 tokens at the first step
    want = SpeculativeEngine(target64).generate(prompt, max_new_tokens=24).tokens
    assert torch.equal(SpeculativeEngine(target64, drafter).generate(prompt, max_new_tokens=24).tokens, want)
    assert drafter.sam_steps == 0 and drafter.fallback_steps > 0 and drafter.online.chosen[0] == 0


def test_adapt_must_be_a_boolean_and_a_fixed_chain_stays_fixed(target64: TargetModel, tiny64: LoadedModel) -> None:
    with pytest.raises(DrafterConfigError, match=r"adapt='yes'; expected true or false"):
        build_drafter({"name": "pld", "num_tokens": "auto", "adapt": "yes"}, target64, tiny64)
    fixed = build_drafter({"name": "pld", "num_tokens": 7, "adapt": True}, target64, tiny64)
    assert fixed.online is None and fixed.num_tokens == 7
    with pytest.raises(DrafterConfigError, match=r"drafter 'samd': adapt=1; expected true or false"):
        build_drafter({"name": "samd", "adapt": 1}, target64, tiny64)


# ----------------------------------------------------------------- Token Recycling's gate
def _recycler(follows: dict[int, int], online: OnlineChain | None) -> TokenRecycleDrafter:
    """A Token Recycling drafter of a 2-node chain template whose table says token ``a`` is
    followed by ``follows[a]`` (rank 0; rank 1 is token 0)."""
    drafter = TokenRecycleDrafter(template=TreeTemplate(parents=(-1, 0), ranks=(0, 0)), top_k=2, online=online)
    table = drafter._ensure_table(200)
    for a, b in follows.items():
        table.candidates[a] = torch.tensor([b, 0])
        table.filled[a] = True
    return drafter


def test_rank0_chain_follows_the_table_until_a_token_without_a_row() -> None:
    drafter = _recycler({5: 6, 6: 7, 7: 8}, None)
    assert drafter.rank0_chain(5, 10) == [6, 7, 8]  # 8 has no row
    assert drafter.rank0_chain(5, 2) == [6, 7]
    assert drafter.rank0_chain(9, 10) == [] and drafter.rank0_chain(5, 0) == []


def test_token_recycling_drafts_only_where_its_request_accepts() -> None:
    """On a dear table with the low prior, a request whose table predicts the target's next
    tokens earns its template within a few steps; one whose table never does drafts nothing,
    while the ungated drafter drafts at every step."""
    text = list(range(100, 140))
    right = {a: b for a, b in zip(text, text[1:])}
    wrong = {a: 7 for a in text}
    good, bad, ungated = _recycler(right, _chain()), _recycler(wrong, _chain()), _recycler(wrong, None)
    drafted = {"good": [], "bad": [], "ungated": []}
    for t in range(10, 30):  # the target's output is the text itself
        ctx = torch.tensor(text[:t])
        for name, d in (("good", good), ("bad", bad), ("ungated", ungated)):
            drafted[name].append(len(d.propose(ctx)))
    assert drafted["good"][0] == 0 and drafted["good"][-1] == 2
    # Ungated, the wrong table drafts token 7 at every step (7 has no row: no second node).
    assert drafted["bad"] == [0] * 20 and drafted["ungated"] == [1] * 20
    assert good.propose(torch.tensor(text[:30])).tokens.tolist() == text[30:32]  # the template, as expanded
    good.reset(torch.tensor(text[:5]))
    assert good.online.reached == [0] * 10  # a new request starts from the prior


@pytest.mark.parametrize("latency", [CPU_LIKE, FLAT], ids=["cpu_like", "flat"])
def test_token_recycling_auto_is_gated_by_default_and_lossless(target64: TargetModel, tiny64: LoadedModel,
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              latency: dict[int, float]) -> None:
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    _seed(target64, tmp_path, latency)
    drafter = build_drafter({"name": "token_recycle"}, target64, tiny64)
    assert isinstance(drafter.online, OnlineChain) and drafter.sizer is not None
    _lossless(target64, drafter, new_tokens=24)
    assert build_drafter({"name": "token_recycle", "adapt": False}, target64, tiny64).online is None
    # SAMD's fallback follows its adapt setting.
    assert isinstance(build_drafter({"name": "samd"}, target64, tiny64).fallback.online, OnlineChain)
    assert build_drafter({"name": "samd", "adapt": False}, target64, tiny64).fallback.online is None


def test_token_recycling_adapt_must_be_a_boolean_and_a_fixed_template_is_not_gated(target64: TargetModel,
                                                                                   tiny64: LoadedModel) -> None:
    with pytest.raises(DrafterConfigError, match=r"token_recycle'?: adapt=1; expected true or false"):
        build_drafter({"name": "token_recycle", "adapt": 1}, target64, tiny64)
    fixed = build_drafter({"name": "token_recycle", "template": "builtin:token_recycle_15.json", "adapt": True},
                          target64, tiny64)
    assert fixed.online is None and len(fixed.template) == 15
