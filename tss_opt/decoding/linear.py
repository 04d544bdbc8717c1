"""The linear layers of our steps through oneDNN's prepacked weights, in bfloat16 on a CPU.

``F.linear`` in bfloat16 on a CPU reaches oneDNN's matmul, which reorders the weight into its
blocked layout on **every call**: for a step's few rows that reorder is most of the product.
Measured on an Intel Xeon with AMX (one thread, 2026-12-04, ``/tmp`` script): SmolLM2's MLP
product (576 -> 1536, 60 distinct weights, so out of cache) took 277 us for one row through
``F.linear`` and 162 us with the weight reordered once (``torch.ops.mkldnn._reorder_linear_weight``,
then ``_linear_pointwise``); 2-16 rows 300-310 us against 193-206 us; the output head
(576 -> 49,152) 9.6 ms against 3.7 ms for one row. Up to 16 rows the outputs were bit-identical
(the same kernel without the reorder); from 64 rows on they differ in the last bf16 place, so
larger inputs (a prefill, a wide tree) keep ``F.linear``: nothing this module does can move a
token at all where it applies.

:func:`pack_linears` reorders every ``nn.Linear`` weight of a bfloat16 model on a CPU once (a
second copy of those weights: 269 MB for SmolLM2-135M) and makes the layer's forward take it
inside :func:`packed_linears` for inputs of at most :data:`PACK_MAX_ROWS` rows. Outside it,
and while ``torch.compile`` traces (the compiled step has its own fused products), the layer
runs ``F.linear`` exactly as before: transformers' own ``generate`` on the same model (the
benchmarks' baseline) runs as shipped. float32 and float64 models are left alone (their
products do not reorder).
"""

from __future__ import annotations

import logging
import os
import types
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

__all__ = ["PACK_MAX_ROWS", "is_packed", "pack_linears", "packed_linears", "packing_supported"]

PACK_MAX_ROWS = 16
"""Rows (tokens) up to which a layer uses its prepacked weight: the measured range where the
outputs equal ``F.linear``'s bit for bit (module docstring)."""

MEMORY_SHARE = 0.25
"""The packed copies may take at most this share of the memory available when packing; a
larger model keeps ``F.linear`` (and says so once) rather than risk the machine's memory."""

_ACTIVE: ContextVar[bool] = ContextVar("tss_packed_linears", default=False)
_PACKED = "_tss_packed_weight"


def packing_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether prepacked products apply: bfloat16 on a CPU whose oneDNN computes bfloat16."""
    if device.type != "cpu" or dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    try:
        return bool(ops._is_mkldnn_bf16_supported()) and hasattr(ops, "_reorder_linear_weight")
    except (AttributeError, RuntimeError):
        return False


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The layer's forward once packed: the prepacked product inside :func:`packed_linears`
    for at most :data:`PACK_MAX_ROWS` rows of the packed dtype, ``F.linear`` otherwise."""
    if torch.compiler.is_compiling():  # first: dynamo must not trace the context variable
        return F.linear(x, self.weight, self.bias)
    packed = getattr(self, _PACKED)
    # The dtypes checked too: a model cast after packing (``model.float()``) keeps F.linear.
    if _ACTIVE.get() and x.dtype == packed.dtype == self.weight.dtype and x.numel() <= PACK_MAX_ROWS * self.in_features:
        return torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "none", [], "")
    return F.linear(x, self.weight, self.bias)


def _available_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


@torch.no_grad()
def pack_linears(model: Any) -> int:
    """Reorder every ``nn.Linear`` weight of ``model`` once for oneDNN (bfloat16 on a CPU;
    anything else is left alone) and install the forward that uses it inside
    :func:`packed_linears`. Idempotent.

    Returns:
        The number of layers packed (0 where packing does not apply or does not fit in
        :data:`MEMORY_SHARE` of the available memory).
    """
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    todo = [m for m in linears if not hasattr(m, _PACKED) and packing_supported(m.weight.device, m.weight.dtype)]
    if not todo:
        return 0
    need = sum(m.weight.numel() * m.weight.element_size() for m in todo)
    avail = _available_bytes()
    if avail and need > MEMORY_SHARE * avail:
        log.info("bfloat16 linear layers kept unpacked: their packed copies (%.0f MB) would take more than "
                 "%.0f %% of the available memory (%.0f MB)", need / 1e6, 100 * MEMORY_SHARE, avail / 1e6)
        return 0
    for m in todo:
        # A plain attribute, not a buffer: state_dict, save_pretrained and exports never see it.
        setattr(m, _PACKED, torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), 1))
        m.forward = types.MethodType(_forward, m)
    log.debug("packed %d bfloat16 linear layers for oneDNN (%.0f MB)", len(todo), need / 1e6)
    return len(todo)


def is_packed(model: Any) -> bool:
    """Whether any linear layer of ``model`` holds a packed weight (its steps cost differently:
    latency tables are keyed by it, decoding/sizing/latency.py)."""
    return any(hasattr(m, _PACKED) for m in model.modules() if isinstance(m, torch.nn.Linear))


@contextmanager
def packed_linears() -> Iterator[None]:
    """Packed layers use their prepacked weights for the forwards in the body (our steps);
    ``F.linear`` again on exit, always."""
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
