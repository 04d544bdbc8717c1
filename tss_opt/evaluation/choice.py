"""``evaluator=auto``: the fastest trial evaluator that gives the engine's figures exactly.

The replay evaluator (:mod:`tss_opt.evaluation.replay`) reproduces the engine's per-prompt
accepted length, tokens and metric when four things hold, and is several times cheaper per
trial (docs/results/replay_benchmark.txt: 4.09x at batch 8 on this CPU):

- greedy decoding (``temperature == 0``) under exact verification: the replay walks the
  drafter's trees along the target's greedy output; sampling and the lossy rules
  (``verification=diversed|cospec``) accept other tokens;
- ``cost=analytic``: the replay runs no speculative decoding to time;
- a replayable drafter (:func:`~tss_opt.evaluation.replay.check_replayable` decides; Token
  Recycling learns from logits at rejected tree nodes that a replay never computes);
- a (device, dtype) whose batched forwards give the one-prompt argmax: :data:`EXACT_BATCHING`.
  Reduced precision (bfloat16, float16) rounds differently with the batch shape, so near-ties
  of the argmax flip and the outputs differ from the engine's.

:func:`choose_evaluator` is a pure function of those facts; the assembly's ``auto`` evaluator
kind reads them from the configuration and the loaded target, logs the choice
(:meth:`EvaluatorChoice.message`) and builds that evaluator.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from tss_opt.config.enums import Verification

if TYPE_CHECKING:
    from tss_opt.decoding.drafter import Drafter

log = logging.getLogger(__name__)

__all__ = ["EXACT_BATCHING", "EvaluatorChoice", "choose_evaluator", "runs_replay"]

EvaluatorKind = Literal["engine", "replay"]

EXACT_BATCHING: frozenset[tuple[str, torch.dtype]] = frozenset({
    # float32 on CPU: replay == engine per prompt on SmolLM2 (docs/results/replay_benchmark.txt);
    # float64: tests/evaluation/test_replay.py. Add an entry only after measuring it.
    ("cpu", torch.float32),
    ("cpu", torch.float64),
})
"""(device type, dtype) pairs where a batched greedy forward gives batch-1 decoding's tokens."""


@dataclass(frozen=True)
class EvaluatorChoice:
    """What ``evaluator=auto`` runs and why.

    Attributes:
        kind: ``"replay"`` or ``"engine"``.
        reason: One clause saying why (every failed condition for the engine).
    """

    kind: EvaluatorKind
    reason: str

    @property
    def message(self) -> str:
        """The one log line, e.g. ``evaluator=auto: engine, because drafter token_recycle is
        not replayable (...)``."""
        return f"evaluator=auto: {self.kind}, because {self.reason}"


def _dtype_name(dtype: torch.dtype | str) -> str:
    return str(dtype).removeprefix("torch.")


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    found = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"dtype={dtype!r} is not a torch dtype; expected e.g. float32, bfloat16, float16")
    return found


def choose_evaluator(
    *,
    temperature: float,
    cost: str,
    device: torch.device | str,
    dtype: torch.dtype | str,
    drafter: Drafter | None,
    drafter_name: str | None = None,
    verification: str = "exact",
) -> EvaluatorChoice:
    """Replay when it reproduces the engine exactly, else the engine (module docstring).

    Args:
        temperature: Decoding temperature (0 = greedy).
        cost: ``"analytic"`` or ``"measured"``.
        device: The target's device (``"cpu"``, ``"cuda:0"``, a ``torch.device``).
        dtype: The target's dtype (``torch.float32`` or its name).
        drafter: A drafter instance as the evaluator would build it (``None``: no drafter);
            its replayability is :func:`~tss_opt.evaluation.replay.check_replayable`'s answer.
        drafter_name: The drafter's config name, for the message (default: its class name).
        verification: ``"exact"`` or a relaxed rule's name.

    Returns:
        The choice; ``reason`` names every condition that rules the replay out.
    """
    from tss_opt.evaluation.replay import ReplayError, check_replayable

    name = drafter_name or ("none" if drafter is None else type(drafter).__name__)
    dev = torch.device(device).type
    dt = _as_dtype(dtype)
    why: list[str] = []
    if float(temperature) != 0.0:
        why.append(f"temperature={temperature} samples (the replay reproduces greedy decoding only)")
    if Verification.lossy_label(str(verification)):
        why.append(f"verification={verification} is lossy (the replay reproduces exact verification only)")
    if str(cost) != "analytic":
        why.append(f"cost={cost} times real decoding (the replay runs none to time)")
    try:
        check_replayable(drafter)
    except ReplayError as e:
        cause = str(e).split("; ")[0]  # the cause, without the fix ("use evaluator=engine") it ends with
        why.append(f"drafter {name} is not replayable ({cause})")
    if (dev, dt) not in EXACT_BATCHING:
        exact = ", ".join(sorted(f"{_dtype_name(d)} on {t}" for t, d in EXACT_BATCHING))
        why.append(
            f"{_dtype_name(dt)} on {dev} is not known to batch exactly (batched forwards round differently and "
            f"flip argmax near-ties, exact: {exact})"
        )
    if why:
        return EvaluatorChoice("engine", "; ".join(why))
    return EvaluatorChoice(
        "replay",
        f"it reproduces the engine exactly here: greedy, exact verification, cost=analytic, drafter {name} is "
        f"replayable, {_dtype_name(dt)} on {dev} batches exactly",
    )


def announce(choice: EvaluatorChoice) -> EvaluatorChoice:
    """Log the choice's one line (INFO) and return it."""
    log.info("%s", choice.message)
    return choice


def runs_replay(evaluator: Any) -> bool:
    """The evaluator (or the one a wrapper such as ``MemoEvaluator`` holds in ``inner``) is a
    replay evaluator: its calibration tokens/s are the batched replay's, not decoding's."""
    from tss_opt.evaluation.replay import ReplayEvaluator

    seen = 0
    while evaluator is not None and seen < 8:  # unwrap MemoEvaluator and the like
        if isinstance(evaluator, ReplayEvaluator):
            return True
        evaluator = evaluator.__dict__.get("inner") if hasattr(evaluator, "__dict__") else None
        seen += 1
    return False
