"""The one lossless rule (tss_opt/decoding/lossless.py): identical passes; in half precision a
first divergence at a near-tie of the plain run passes; a clear difference fails; float32 needs
equal tokens."""

from __future__ import annotations

import pytest
import torch

from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.lossless import (
    TIE_ULPS,
    check_lossless,
    first_difference,
    judge,
    tie_tolerance,
)
from tss_opt.decoding.target import TargetModel
from tss_opt.models import ModelConfig, load_model

BF16_EPS = torch.finfo(torch.bfloat16).eps  # 2**-7


def _logits(top: float, second: float, vocab: int = 8) -> torch.Tensor:
    """Logits of shape (vocab,): token 1 at ``top``, token 2 at ``second``, the rest far below."""
    lg = torch.full((vocab,), -10.0)
    lg[1], lg[2] = top, second
    return lg


def test_identical_passes_without_a_forward():
    def never(j: int) -> torch.Tensor:
        raise AssertionError("no logits are needed for equal tokens")

    check = judge([1, 2, 3], [1, 2, 3], never, torch.bfloat16)
    assert check.verdict == "identical" and check.lossless and check.divergence is None


def test_constructed_tie_passes_in_bfloat16_and_fails_in_float32():
    # Top logit 16: tolerance 4 ulps = 4 * 2**-7 * 16 = 0.5; the runner-up 0.25 below is a tie.
    lg = _logits(16.0, 15.75)
    assert tie_tolerance(lg, torch.bfloat16) == pytest.approx(TIE_ULPS * BF16_EPS * 16.0) == pytest.approx(0.5)
    check = judge([5, 1, 7], [5, 2, 9], lambda j: lg, torch.bfloat16)
    assert check.verdict == "near_tie" and check.lossless
    d = check.divergence
    assert d is not None and d.position == 1 and d.margin == pytest.approx(0.25) and d.near_tie
    # The same margin in float32 is a failure: full precision must give equal tokens.
    check32 = judge([5, 1, 7], [5, 2, 9], lambda j: lg, torch.float32)
    assert check32.verdict == "diverged" and not check32.lossless and check32.divergence.tolerance == 0.0


def test_clear_difference_fails():
    lg = _logits(16.0, 14.0)  # margin 2.0 > 0.5
    check = judge([1, 1], [2, 1], lambda j: lg, torch.bfloat16)
    assert check.verdict == "diverged" and not check.lossless
    assert check.divergence.position == 0 and check.divergence.margin == pytest.approx(2.0)


def test_early_stop_is_a_divergence_not_a_tie():
    check = judge([1, 2, 3], [1, 2], lambda j: _logits(16.0, 16.0), torch.bfloat16)
    assert check.verdict == "diverged" and check.divergence.position == 2
    assert first_difference([1, 2], [1, 2]) is None and first_difference([1, 2], [1, 3]) == 1


def _margins(target: TargetModel, prompt: torch.Tensor, plain: list[int], n: int) -> list[tuple[int, float, float]]:
    """Per position: (runner-up token, top-1 minus runner-up logit, the bf16 tolerance)."""
    out = []
    with torch.inference_mode():
        for j in range(n):
            ids = torch.cat([prompt, torch.tensor(plain[:j], dtype=torch.long)])
            lg = target.model(input_ids=ids[None]).logits[0, -1].float()
            v, i = lg.topk(2)
            tol = TIE_ULPS * BF16_EPS * float(lg.abs().max())
            out.append((int(i[1]), float(v[0] - v[1]), tol))
    return out


def test_on_a_model_near_ties_count_only_in_half_precision():
    """check_lossless recomputes the plain target's margin by a fresh forward; swapping in the
    runner-up at each position gives both verdicts in bfloat16, only failures in float32."""
    for dtype in ("bfloat16", "float32"):
        loaded = load_model(ModelConfig(name="tiny", source="tiny", num_layers=4, dtype=dtype))
        target = TargetModel(loaded.model)
        prompt = loaded.tokenizer("the cat sat", return_tensors="pt").input_ids[0]
        plain = SpeculativeEngine(target).generate(prompt, max_new_tokens=8).tokens.tolist()
        assert check_lossless(target, prompt, plain, list(plain)).verdict == "identical"
        verdicts = []
        for j, (runner_up, margin, tol) in enumerate(_margins(target, prompt, plain, 6)):
            got = plain[:j] + [runner_up] + plain[j + 1 :]
            check = check_lossless(target, prompt, plain, got)
            d = check.divergence
            assert d is not None and d.position == j
            assert abs(d.margin - margin) < 1e-6
            want = margin <= tol if dtype == "bfloat16" else False  # float32: tokens must be equal
            assert d.near_tie is want and check.lossless is want
            verdicts.append(d.near_tie)
        if dtype == "bfloat16":  # both verdicts occur, so the check can fail
            assert True in verdicts and False in verdicts, verdicts
