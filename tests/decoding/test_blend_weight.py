"""DIVERSED's context-dependent weight: a :class:`WeightPolicy` in the Verifier.

- a policy that always answers w = 1 (a learned one saturated at 1) reproduces exact
  verification token for token (tiny float64 model, dense and sparse target, greedy, coupled
  and sampled), as the fixed ``weight=1.0`` does (test_relaxed.py);
- acceptance never falls below exact verification's on the same step (random steps, random
  learned weights);
- the EAGLE drafter gives per-node distributions for relaxed verification;
- bad input: a weight outside [0, 1] from a policy, a weight policy outside diversed, files of
  the wrong kind.
"""

from __future__ import annotations

import pytest
import torch

from tss_opt.decoding.drafters import EagleDrafter, SelfDrafter, random_eagle_head
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.tree import DraftTree
from tss_opt.decoding.verify.accept import (
    PositionalSampler,
    accept_coupled,
    accept_greedy,
    accept_sampling,
)
from tss_opt.decoding.verify.arbitration import FEATURES, LogisticPolicy
from tss_opt.decoding.verify.blend_weight import LearnedWeight, WeightPolicy
from tss_opt.decoding.verify.relaxed import (
    RelaxedVerificationError,
    Verifier,
    verifier_from_settings,
)
from tss_opt.errors import TSSError

N_NEW = 32


@pytest.fixture(scope="module")
def prompt(tiny64) -> torch.Tensor:
    return tiny64.tokenizer("the cat sat on the mat. the cat sat on the", return_tensors="pt").input_ids[0]


def _saturated() -> LearnedWeight:
    """sigmoid(50 + ...) rounds to exactly 1.0 in float64 for every feature vector in [0, 1]."""
    theta = torch.zeros(len(FEATURES), dtype=torch.float64)
    theta[0] = 50.0
    return LearnedWeight(theta)


def _run(tiny64, prompt, verification, skip=(), temperature=0.0, drafter_temperature=0.0):
    drafter = SelfDrafter(tiny64.model, skip=[1, 2], num_tokens=3, temperature=drafter_temperature, seed=3)
    engine = SpeculativeEngine(TargetModel(tiny64.model), drafter, verification=verification)
    return engine.generate(prompt, max_new_tokens=N_NEW, skip=skip, temperature=temperature, seed=5)


@pytest.mark.parametrize("skip", [(), (1,)])
@pytest.mark.parametrize(
    "temperature,drafter_temperature", [(0.0, 0.0), (0.8, 0.0), (0.8, 0.8)], ids=["greedy", "coupled", "sampled"]
)
def test_policy_always_one_reproduces_exact(tiny64, prompt, skip, temperature, drafter_temperature):
    exact = _run(tiny64, prompt, "exact", skip, temperature, drafter_temperature)
    assert exact.stats.draft_proposed > 0
    policy = _saturated()
    out = _run(tiny64, prompt, Verifier("diversed", weight_policy=policy), skip, temperature, drafter_temperature)
    assert out.tokens.tolist() == exact.tokens.tolist()
    assert out.stats.steps == exact.stats.steps
    assert out.stats.lossy and out.stats.relaxed_accepted == 0
    assert out.stats.verification == "diversed(w=learned)"


def test_policy_near_zero_accepts_more_and_says_so(tiny64, prompt):
    """The test above can fail: a learned weight near 0 keeps draft tokens exact rejects."""
    theta = torch.zeros(len(FEATURES), dtype=torch.float64)
    theta[0] = -8.0
    exact = _run(tiny64, prompt, "exact")
    out = _run(tiny64, prompt, Verifier("diversed", weight_policy=LearnedWeight(theta)))
    assert out.stats.relaxed_accepted > 0 and out.stats.accept_length > exact.stats.accept_length
    assert out.stats.to_dict()["verification"] == "diversed(w=learned)" and out.stats.lossy


# ------------------------------------------------------------- acceptance never below exact
def _random_step(gen: torch.Generator, n: int, vocab: int, sharp: float):
    logits = torch.randn(n + 1, vocab, generator=gen, dtype=torch.float64) * sharp
    q = torch.softmax(logits[:n] + torch.randn(n, vocab, generator=gen, dtype=torch.float64) * sharp, dim=-1)
    return logits, q


def _random_policy(gen: torch.Generator) -> LearnedWeight:
    return LearnedWeight(torch.randn(len(FEATURES), generator=gen, dtype=torch.float64) * 3)


def test_learned_weight_acceptance_never_below_exact_greedy_and_coupled():
    gen = torch.Generator().manual_seed(0)
    more = 0
    for trial in range(300):
        logits, q = _random_step(gen, 5, 12, sharp=2.0)
        toks = q.argmax(-1)
        if trial % 3 == 0:
            toks[:2] = logits[:2].argmax(-1)
        v = Verifier("diversed", weight_policy=_random_policy(gen))
        for tree in (
            DraftTree.chain(toks, probs=q, sampled=False),
            DraftTree(tokens=toks, parents=(-1, -1, 0, 0, 2), probs=q, sampled=False),
        ):
            ex, _ = accept_greedy(tree, logits)
            got, committed, _ = v.accept(tree, logits, temperature=0.0, sampler=None, generator=None, position=0)
            assert len(got) >= len(ex) and got[: len(ex)] == ex and len(committed) == len(got) + 1
            more += len(got) > len(ex)
            sampler = PositionalSampler(0.9, seed=trial)
            ex_c, _ = accept_coupled(tree, logits, sampler, 4)
            got_c, _, _ = v.accept(tree, logits, temperature=0.9, sampler=sampler, generator=None, position=4)
            assert len(got_c) >= len(ex_c) and got_c[: len(ex_c)] == ex_c
    assert more > 0, "the learned weight never accepted more: the test proves nothing"


def test_learned_weight_acceptance_never_below_exact_sampled_chains():
    gen = torch.Generator().manual_seed(1)
    more = 0
    for trial in range(300):
        logits, q = _random_step(gen, 4, 10, sharp=1.5)
        tree = DraftTree.chain(torch.multinomial(q, 1, generator=gen).reshape(-1), probs=q.float())
        v = Verifier("diversed", weight_policy=_random_policy(gen))
        ex, _ = accept_sampling(tree, logits.float(), 0.8, torch.Generator().manual_seed(trial))
        got, _, _ = v.accept(
            tree, logits.float(), temperature=0.8, sampler=PositionalSampler(0.8, 0),
            generator=torch.Generator().manual_seed(trial), position=0,
        )
        assert len(got) >= len(ex) and got[: len(ex)] == ex
        more += len(got) > len(ex)
    assert more > 0


# ---------------------------------------------------------------------------------- EAGLE
def test_eagle_gives_distributions_and_w1_is_exact(tiny64, prompt):
    target = TargetModel(tiny64.model)
    head = random_eagle_head(tiny64.model, seed=1)

    def run(verification):
        d = EagleDrafter(head, total_tokens=8, depth=3, top_k=2)
        return d, SpeculativeEngine(target, d, verification=verification).generate(prompt, max_new_tokens=16)

    d, exact = run("exact")
    assert not d.return_probs  # exact verification does not ask for distributions
    d, same = run(Verifier("diversed", weight=1.0))
    assert d.return_probs and same.tokens.tolist() == exact.tokens.tolist()
    tree = d.propose(torch.cat([prompt, same.tokens]))  # a fresh draft after the request
    assert tree.probs is not None and tree.probs.shape == (len(tree), tiny64.model.config.vocab_size)
    assert not tree.sampled
    # Each node's distribution is the one it was drafted from: its own probability is its confidence.
    own = tree.probs[torch.arange(len(tree)), tree.tokens]
    torch.testing.assert_close(own, tree.confidence, rtol=1e-4, atol=1e-6)
    _, loose = run(Verifier("diversed", weight=0.0))
    assert loose.stats.relaxed_accepted > 0


# ------------------------------------------------------------------------------ bad input
class OutOfRange(WeightPolicy):
    name = "broken"

    def weight(self, features: torch.Tensor) -> float:
        return 1.5


def test_policy_weight_outside_range_is_refused():
    logits = torch.tensor([[0.0, 5.0], [0.0, 0.0]], dtype=torch.float64)
    tree = DraftTree.chain([0], probs=torch.tensor([[0.9, 0.1]], dtype=torch.float64), sampled=False)
    with pytest.raises(RelaxedVerificationError, match=r"w=1.5, outside \[0, 1\]"):
        Verifier("diversed", weight_policy=OutOfRange()).accept(
            tree, logits, temperature=0.0, sampler=None, generator=None, position=0
        )


def test_weight_policy_needs_diversed():
    with pytest.raises(RelaxedVerificationError, match="verification=diversed"):
        Verifier("cospec", weight_policy=_saturated())


def test_files_round_trip_and_are_not_mixed_up(tmp_path):
    w = LearnedWeight(torch.arange(len(FEATURES), dtype=torch.float64) / 10)
    path = w.save(tmp_path / "w.json")
    assert torch.equal(LearnedWeight.load(path).theta, w.theta)
    v = verifier_from_settings("diversed", {"weight_policy": str(path), "weight": 0.3})
    assert v.weight_policy is not None and v.describe() == "diversed(w=learned)"
    p = LogisticPolicy().save(tmp_path / "p.json")
    with pytest.raises(TSSError, match="not a DIVERSED weight policy"):
        LearnedWeight.load(p)
    with pytest.raises(TSSError, match="not a CoSpec policy"):
        LogisticPolicy.load(path)
    with pytest.raises(TSSError, match="does not exist"):
        LearnedWeight.load(tmp_path / "missing.json")
