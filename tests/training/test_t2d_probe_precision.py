"""The T2D probe's lossless check in half precision: a first divergence at a near-tie of the
plain run counts as lossless, a clear divergence does not; float32 needs equal tokens."""

from __future__ import annotations

import torch

from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.target import TargetModel
from tss_opt.models import ModelConfig, load_model
from tss_opt.training.t2d import HALF_TIE_ULPS, divergence


def _margins(target, prompt, plain, n):
    """Per position: (runner-up token, top-1 minus runner-up logit, the bf16 tolerance)."""
    out = []
    with torch.inference_mode():
        for j in range(n):
            ids = torch.cat([prompt, torch.tensor(plain[:j], dtype=torch.long)])
            lg = target.model(input_ids=ids[None]).logits[0, -1].float()
            v, i = lg.topk(2)
            tol = HALF_TIE_ULPS * torch.finfo(torch.bfloat16).eps * float(lg.abs().max())
            out.append((int(i[1]), float(v[0] - v[1]), tol))
    return out


def test_near_ties_count_as_lossless_only_in_half_precision():
    for dtype in ("bfloat16", "float32"):
        loaded = load_model(ModelConfig(name="tiny", source="tiny", num_layers=4, dtype=dtype))
        target = TargetModel(loaded.model)
        prompt = loaded.tokenizer("the cat sat", return_tensors="pt").input_ids[0]
        plain = SpeculativeEngine(target).generate(prompt, max_new_tokens=8).tokens.tolist()
        assert divergence(target, prompt, plain, list(plain), ()) is None
        verdicts = []
        for j, (runner_up, margin, tol) in enumerate(_margins(target, prompt, plain, 6)):
            got = plain[:j] + [runner_up] + plain[j + 1 :]
            d = divergence(target, prompt, plain, got, ())
            assert d is not None and d["position"] == j
            assert abs(d["margin"] - margin) < 1e-6
            want = margin <= tol if dtype == "bfloat16" else False  # float32: tokens must be equal
            assert d["near_tie"] is want
            verdicts.append(d["near_tie"])
        if dtype == "bfloat16":  # both verdicts occur, so the check can fail
            assert True in verdicts and False in verdicts, verdicts
