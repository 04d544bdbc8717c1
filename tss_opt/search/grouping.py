"""Grouped trials: how many queued trials a worker claims and evaluates together.

``search.group_size`` is a positive integer or ``"auto"``. A worker whose evaluator can
generate several skip sets in one batch (it says so with ``supports_groups = True`` and
offers ``call_group(skips, prompt_ids=None)``, one answer per skip set: the replay evaluator)
claims up to that many queued trials, evaluates them together and tells each; any other
evaluator (the engine) runs one trial at a time, with one log line when a group was asked for.
The group size never changes which configurations are evaluated or their figures (per prompt
a grouped evaluation equals one trial alone), so it is not part of the study's identity.

``"auto"`` takes :data:`AUTO_GROUP_SIZE` for the target's device type. On this CPU the
measurement (docs/results/grouped_benchmark.txt, docs/evaluator.md) decides the value.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tss_opt.config.search import parse_group_size

__all__ = ["AUTO_GROUP_SIZE", "group_call", "parse_group_size", "resolve_group_size"]

log = logging.getLogger("tss_opt.search")

AUTO_GROUP_SIZE: dict[str, int] = {"cpu": 2, "cuda": 4}
"""``group_size: auto`` per device type (docs/evaluator.md, "Grouped trials", for the why)."""


def group_call(evaluator: Any) -> Callable[..., Sequence[Any]] | None:
    """The evaluator's ``call_group`` when it generates several skip sets together, else ``None``."""
    if not getattr(evaluator, "supports_groups", False):
        return None
    call = getattr(evaluator, "call_group", None)
    return call if callable(call) else None


def _device_type(evaluator: Any) -> str:
    target = getattr(evaluator, "target", None)
    device = getattr(target, "device", None)
    return torch.device(device).type if device is not None else "cpu"


def resolve_group_size(value: Any, evaluator: Any) -> int:
    """The group size a worker uses with ``evaluator`` (module docstring); logs once why an
    explicit size above 1 is ignored."""
    size = parse_group_size(value)
    if group_call(evaluator) is None:
        if size != "auto" and size > 1:
            log.info(
                "search.group_size=%d is ignored: the evaluator (%s) generates one skip set at a time; "
                "only evaluator=replay groups trials", size, type(evaluator).__name__,
            )
        return 1
    if size == "auto":
        dev = _device_type(evaluator)
        return AUTO_GROUP_SIZE.get(dev, AUTO_GROUP_SIZE["cuda"])
    return size
