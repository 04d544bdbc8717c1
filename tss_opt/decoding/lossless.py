"""Lossless, defined once: a speculative output against plain greedy decoding of the same
target (same skip set, same precision).

With temperature 0 a speculative run must emit exactly the tokens plain greedy decoding
emits (docs/engine.md, "Lossless"). In float32/float64 that is the whole rule: the engine's
outputs equal plain decoding's token for token (measured on SmolLM2 and the tiny model).

In half precision (bfloat16, float16) verifying k tokens in one forward and decoding them one
at a time sum in other orders, and the logits are rounded to the dtype's 8 (bf16) or 11
(fp16) significant bits, so where the plain run's two best tokens are within a few units in
the last place of each other either side can win: the speculative run may take the other
side of a near-tie and continue from there (seen here: bfloat16 SmolLM2 outputs differ from
float32's and from transformers' bfloat16 greedy at such positions). Such a divergence is
not a bug of the drafter or the verifier, and everything after it is a different, equally
greedy continuation, so only the *first* divergence is judged:

- ``identical``: equal tokens;
- ``near_tie``: at the first differing position ``j`` the plain target's logit margin between
  the token it chose and the one the speculative run chose, from a fresh forward over the
  prompt and ``plain[:j]``, is at most :func:`tie_tolerance`: ``TIE_ULPS`` ulps of the
  largest logit in the dtype (4 x 2^-7 x max|logit| in bfloat16: 0.5 at a top logit of 16);
  in float32/float64 the tolerance is 0, so only equal tokens pass;
- ``diverged``: anything else (a larger margin, or one run stopping early): a failure.

Four ulps, not one: the margin is recomputed by a third forward (no cache, the whole prefix
at once) whose rounding differs from both runs', and a deep model accumulates rounding in
every layer. It is the T2D probe's earlier rule, kept as it was; the bugs this check exists
to catch (a wrong mask, a wrong cache crop, a wrong acceptance) change logits by far more
than a few ulps (a cache that answers its length from a skipped layer was measured at logit
differences of 24-38 on SmolLM2), so the tolerance does not hide them.

:func:`judge` is the pure rule over tokens and the logits at the divergence;
:func:`check_lossless` computes those logits on a :class:`~tss_opt.decoding.TargetModel`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from tss_opt.decoding.dtypes import HALF_DTYPES

if TYPE_CHECKING:
    from tss_opt.decoding.target import TargetModel

__all__ = [
    "HALF_DTYPES",
    "TIE_ULPS",
    "Divergence",
    "LosslessCheck",
    "Verdict",
    "check_lossless",
    "first_difference",
    "judge",
    "tie_tolerance",
]

TIE_ULPS = 4
"""Units in the last place of the largest logit within which a half-precision divergence
counts as a near-tie (module docstring: why four)."""

Verdict = Literal["identical", "near_tie", "diverged"]


@dataclass(frozen=True)
class Divergence:
    """The first position where the speculative tokens differ from plain decoding's.

    Attributes:
        position: Index ``j`` into the generated tokens (0 = the first new token).
        margin: The plain target's logit of ``plain[j]`` minus that of ``got[j]`` there
            (``inf`` when one run stopped early: no tie to speak of).
        tolerance: :func:`tie_tolerance` at that position (0 in float32/float64).
        near_tie: ``margin <= tolerance``.
    """

    position: int
    margin: float
    tolerance: float
    near_tie: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LosslessCheck:
    """The verdict on one prompt: ``identical``, ``near_tie`` or ``diverged`` (module docstring).

    Attributes:
        verdict: The verdict.
        divergence: The first divergence (``None`` when identical).
    """

    verdict: Verdict
    divergence: Divergence | None = None

    @property
    def lossless(self) -> bool:
        """Identical, or a first divergence at a near-tie: what counts as lossless."""
        return self.verdict != "diverged"


def tie_tolerance(logits: torch.Tensor, dtype: torch.dtype) -> float:
    """The largest logit margin that counts as a near-tie in ``dtype``.

    Args:
        logits: ``torch.FloatTensor`` of shape ``(V,)``: the plain target's next-token logits.
        dtype: The precision the target ran in.

    Returns:
        ``TIE_ULPS * eps(dtype) * max|logits|`` for bfloat16/float16; 0.0 otherwise.
    """
    if dtype not in HALF_DTYPES:
        return 0.0
    return TIE_ULPS * torch.finfo(dtype).eps * float(logits.float().abs().max())


def first_difference(plain: Sequence[int], got: Sequence[int]) -> int | None:
    """The first index where the two token lists differ (the shorter length when one is a
    prefix of the other), or ``None`` when they are equal."""
    if list(plain) == list(got):
        return None
    return next((i for i, (a, b) in enumerate(zip(plain, got)) if a != b), min(len(plain), len(got)))


def judge(
    plain: Sequence[int],
    got: Sequence[int],
    logits_at: Callable[[int], torch.Tensor],
    dtype: torch.dtype,
) -> LosslessCheck:
    """The lossless verdict of ``got`` against ``plain`` (module docstring).

    Args:
        plain: The plain greedy run's generated tokens.
        got: The speculative run's generated tokens.
        logits_at: ``j -> `` the plain target's next-token logits (``torch.FloatTensor`` of
            shape ``(V,)``) after the prompt and ``plain[:j]``; called at most once, at the
            first divergence.
        dtype: The precision both runs used.
    """
    j = first_difference(plain, got)
    if j is None:
        return LosslessCheck("identical")
    if j >= min(len(plain), len(got)):  # one run stopped early (EOS or length): no tie to weigh
        return LosslessCheck("diverged", Divergence(j, float("inf"), 0.0, False))
    logits = logits_at(j)
    tol = tie_tolerance(logits, dtype)
    margin = float(logits[plain[j]].float() - logits[got[j]].float())
    near = dtype in HALF_DTYPES and margin <= tol  # full precision: only equal tokens pass
    return LosslessCheck("near_tie" if near else "diverged", Divergence(j, margin, tol, near))


def check_lossless(
    target: TargetModel,
    prompt: torch.Tensor,
    plain: Sequence[int],
    got: Sequence[int],
    skip: Sequence[int] = (),
) -> LosslessCheck:
    """:func:`judge` with the plain target's logits from one fresh forward (no cache) of
    ``prompt`` and ``plain[:j]`` under ``skip``, in the target's own dtype.

    Args:
        target: The :class:`~tss_opt.decoding.TargetModel` both runs decoded with.
        prompt: ``torch.LongTensor`` of shape ``(P,)``: the prompt's token ids.
        plain: Plain greedy decoding's generated tokens.
        got: The speculative run's generated tokens.
        skip: The skip set both runs used (``()``: dense).
    """

    def logits_at(j: int) -> torch.Tensor:
        ids = torch.cat([prompt.reshape(-1).cpu(), torch.tensor(list(plain[:j]), dtype=torch.long)]).to(target.device)
        with torch.inference_mode(), target.skip(skip):
            return target.model(input_ids=ids[None], logits_to_keep=1).logits[0, -1]  # [V]

    return judge(plain, got, logits_at, target.dtype)
