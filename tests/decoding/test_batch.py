"""Continuous batching: many requests in one target forward, each on its own skip
set, each row exactly what its request alone emits."""

from __future__ import annotations

import json

import pytest
import torch

from tss_opt.decoding.batch import BatchEngine
from tss_opt.decoding.batch_budget import (
    BatchLatency,
    DepthPolicy,
    RowOdds,
    choose_depth,
    load_or_measure_batch_latency,
)
from tss_opt.decoding.drafters.prompt_lookup import PromptLookupDrafter
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.sizing.latency import TreeSizingError
from tss_opt.decoding.target import TargetModel

N_NEW = 20


def pld() -> PromptLookupDrafter:
    return PromptLookupDrafter(num_tokens=4, max_ngram=2, min_ngram=1)


@pytest.fixture(scope="module")
def target(tiny) -> TargetModel:
    return TargetModel(tiny.model, layers_path=tiny.config.layers_path)


def _prompts(n: int, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = torch.randint(3, 250, (4 + 3 * i,), generator=g)
        out.append(torch.cat([p, p]))  # a repeat: prompt lookup finds drafts
    return out


# Rows of every kind: dense and sparse, both scopes, greedy and seeded sampling.
ROWS = [
    dict(skip=frozenset(), scope="verify", temperature=0.0),
    dict(skip=frozenset({1}), scope="all", temperature=0.0),
    dict(skip=frozenset({0, 2}), scope="verify", temperature=0.0),
    dict(skip=frozenset({3}), scope="all", temperature=0.8),
    dict(skip=frozenset({1}), scope="verify", temperature=0.0),
    dict(skip=frozenset(), scope="verify", temperature=1.0),
]


def _alone(target: TargetModel, prompt: torch.Tensor, spec: dict, drafter=pld) -> torch.Tensor:
    eng = SpeculativeEngine(target, drafter())
    return eng.generate(prompt, max_new_tokens=N_NEW, skip=spec["skip"], scope=spec["scope"],
                        temperature=spec["temperature"], seed=7).tokens


@pytest.mark.parametrize("depth", [None, DepthPolicy(fixed=0), DepthPolicy(fixed=1)], ids=["as-alone", "cap0", "cap1"])
def test_every_row_emits_exactly_what_its_request_alone_emits(target, depth):
    prompts = _prompts(len(ROWS))
    want = [_alone(target, p, s) for p, s in zip(prompts, ROWS)]
    batch = BatchEngine(target, depth)
    rows = []
    for i, (p, s) in enumerate(zip(prompts, ROWS)):
        rows.append(batch.admit(p, max_new_tokens=N_NEW, drafter=pld(), seed=7, **s))
        if i % 2:  # rows join while others are mid-flight
            batch.step()
    batch.run()
    for row, w, s in zip(rows, want, ROWS):
        got = row.result()
        assert torch.equal(got.tokens, w), s
        assert got.stats.new_tokens == len(w)
    if depth is not None and depth.fixed == 0:
        # Capped at 0 in every batched step: no row drafted while it had company.
        assert all(r.state.stats.draft_proposed <= rows[-1].state.stats.steps for r in rows)


def test_a_skipped_layer_saves_that_rows_compute(target):
    """Layer 1 sees only the tokens of the rows that run it (gathered), and each row's
    executed-layer count is its own: steps x (layers - |S|)."""
    seen: list[int] = []
    # The block's MLP sees what the block computes on (the skip mechanism gathers first).
    handle = target.model.model.layers[1].mlp.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[1]))
    try:
        batch = BatchEngine(target)
        prompts = _prompts(2, seed=3)
        dense = batch.admit(prompts[0], max_new_tokens=6, skip=())
        sparse = batch.admit(prompts[1], max_new_tokens=6, skip={1, 2})
        batch.step()  # both prefills (verify scope: dense), one forward
        assert seen == [len(prompts[0]) + len(prompts[1])]
        seen.clear()
        batch.run()
    finally:
        handle.remove()
    L = target.num_layers
    d, s = dense.result().stats, sparse.result().stats
    assert d.verify_layer_forwards == d.steps * L
    assert s.verify_layer_forwards == s.steps * (L - 2)
    assert d.prefill_layer_forwards == s.prefill_layer_forwards == L
    # While both decoded, layer 1 ran on the dense row's single token only.
    assert seen and set(seen) == {1}


def test_a_dropped_row_leaves_and_the_others_are_unchanged(target):
    prompts = _prompts(3, seed=5)
    want = [_alone(target, p, ROWS[0]) for p in prompts]
    batch = BatchEngine(target)
    rows = [batch.admit(p, max_new_tokens=N_NEW, drafter=pld()) for p in prompts]
    batch.step()
    batch.step()
    batch.drop(rows[1])
    assert rows[1] not in batch.rows and len(batch) == 2
    batch.run()
    assert torch.equal(rows[0].result().tokens, want[0]) and torch.equal(rows[2].result().tokens, want[2])
    cut = rows[1].result().tokens
    assert 0 < len(cut) < len(want[1]) and torch.equal(cut, want[1][: len(cut)])


def test_a_row_dropped_before_its_first_step_answers_with_no_tokens(target):
    batch = BatchEngine(target)
    row = batch.admit(_prompts(1)[0], max_new_tokens=5)
    batch.drop(row)
    res = row.result()
    assert res.tokens.numel() == 0 and res.stats.new_tokens == 0 and batch.step() == []


def test_admission_refuses_bad_requests_with_the_fix(target):
    batch = BatchEngine(target)
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        batch.admit([1, 2], max_new_tokens=0)
    with pytest.raises(ValueError, match="prompt is empty"):
        batch.admit([], max_new_tokens=3)
    with pytest.raises(ValueError, match="scope='some'"):
        batch.admit([1], max_new_tokens=3, scope="some")
    assert len(batch) == 0


# ------------------------------------------------------------------ choosing the depth
def _table(per_row_token_s: float, base_s: float = 1.0) -> BatchLatency:
    """seconds = base + per_row_token_s x rows x tokens: the cost of tokens beyond the weights."""
    rows, tokens = (1, 2, 4, 8, 16), (1, 2, 3, 5, 9)
    secs = tuple(tuple(base_s + per_row_token_s * r * t for t in tokens) for r in rows)
    return BatchLatency(rows=rows, tokens=tokens, seconds=secs)


def test_free_drafting_drafts_deepest_and_costly_drafting_not_at_all():
    odds = [RowOdds(proposal_rate=1.0, acceptance=0.8, steps=100)] * 8
    assert choose_depth(_table(0.0), 8, odds, max_depth=8) == 8  # extra tokens cost nothing
    assert choose_depth(_table(1.0, base_s=0.01), 8, odds, max_depth=8) == 0  # tokens cost everything


def test_the_depth_is_the_hand_computed_argmax():
    """One row, m = 1, a = 0.8 (steps huge: no prior): tokens(k) = 1 + 0.8 + ... + 0.8^k;
    seconds(k) = 1 + 0.5 x (1 + k) at rows = 1. Speeds: k=0 0.667, k=1 0.900, k=2 0.976,
    k=3 0.984, k=4 0.960: the argmax is 3."""
    odds = [RowOdds(proposal_rate=1.0, acceptance=0.8, steps=10**9)]
    assert choose_depth(_table(0.5), 1, odds, max_depth=8) == 3


def test_a_row_alone_drafts_as_alone_and_a_fixed_cap_holds():
    policy = DepthPolicy(latency=_table(1.0, base_s=0.01))
    assert policy.choose(1, [RowOdds()]) is None
    assert policy.choose(4, [RowOdds()] * 4) == 0
    assert DepthPolicy(fixed=2).choose(9, []) == 2
    with pytest.raises(ValueError, match="either"):
        DepthPolicy()


def test_row_odds_shrink_towards_the_prior_while_short():
    m, a = RowOdds(proposal_rate=1.0, acceptance=1.0, steps=4).shrunk()
    assert m == pytest.approx(0.75) and a == pytest.approx(0.75)
    assert RowOdds().shrunk() == (pytest.approx(0.5), pytest.approx(0.5))  # no history: the prior


def test_the_latency_table_interpolates_and_extrapolates():
    t = _table(0.5)
    assert t.at(4, 3) == pytest.approx(1 + 0.5 * 12)
    assert t.at(3, 2) == pytest.approx(1 + 0.5 * 6)  # between measured points: bilinear, exact here
    assert t.at(32, 9) == pytest.approx(1 + 0.5 * 32 * 9)  # beyond the largest batch: linear
    assert BatchLatency.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    with pytest.raises(TreeSizingError, match="increase"):
        BatchLatency(rows=(2, 1), tokens=(1,), seconds=((1.0,), (1.0,)))
    with pytest.raises(TreeSizingError, match="positive"):
        BatchLatency(rows=(1,), tokens=(1,), seconds=((0.0,),))


def test_the_batch_latency_table_is_measured_once_and_cached(target, tmp_path):
    first = load_or_measure_batch_latency(target, tmp_path)
    files = list(tmp_path.glob("batch-latency-*.json"))
    assert len(files) == 1 and first.rows == (1, 2, 4, 8, 16, 32)
    # Monotone: more rows or more tokens never measure faster (noise cannot invert the table).
    s = first.seconds
    assert all(s[i][j] <= s[i + 1][j] for i in range(len(s) - 1) for j in range(len(s[0])))
    assert all(s[i][j] <= s[i][j + 1] for i in range(len(s)) for j in range(len(s[0]) - 1))
    assert load_or_measure_batch_latency(target, tmp_path) == first  # read back, not measured again
