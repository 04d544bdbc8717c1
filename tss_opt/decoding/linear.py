"""The linear layers of our steps through prepacked weights (bfloat16) or our float32 kernel, on a CPU.

**float32** (since 2026-12-06): where our float32 rows kernel runs (``kernels/rows_f32.py``:
AVX2 and FMA, built from C at first use) and the target computes on one thread, a step's
products of 1 to :data:`PACK_MAX_ROWS` rows go through it, reading the layer's own weight in
place (no copy): each weight read once for all of the step's rows, row-invariant, where MKL's
products of 2-16 rows cost far more than its one-row product. Values differ from MKL's in the
last float32 places (another summation order), as two BLAS libraries' would; eager plain and
speculative decoding both run it, so their products agree bit for bit. Inside compiled graphs
it runs from :data:`GRAPH_MIN_ROWS` rows, as the bfloat16 kernels do: inductor's one-row
product and fused head were as fast (``benchmarks/rows_kernel.py --dtype float32``: a compiled
plain step 41.5 ms either way after 64 cached tokens, 2-4 slots 1.29-1.47x faster with the
kernel, on an AMD EPYC without AVX-512), and a compiled plain step's products differ from a
verification's in the last places, as they did with MKL's. The rest of this docstring is
about bfloat16.

Two kernels hold the packed bfloat16 weights: our **rows kernel** (``kernels/rows.py``: AVX-512 BF16,
built from C at first use, one thread; each weight read once for all of a step's rows, the
values of oneDNN's one-row product, row-invariant) where it runs and the target computes on one
thread, and **oneDNN**'s prepacked product elsewhere (more threads, or a CPU or machine without
what the kernel needs). Where oneDNN computes on **AMX** tiles (``amx_bf16``), a layer holds
both: the rows kernel for up to :func:`amx_from_rows` - 1 rows, oneDNN's AMX product from
:func:`amx_from_rows` rows (below). :func:`pack_linears` decides once per model and says which
(INFO); :func:`packed_kernel` tells. What follows was measured with oneDNN and holds for both: the
products take the packed weight for a step's few rows and ``F.linear`` otherwise.

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
inside :func:`packed_linears` for inputs of at most :data:`PACK_MAX_ROWS` rows. Outside it the
layer runs ``F.linear`` exactly as before: transformers' own ``generate`` on the same model (the
benchmarks' baseline) runs as shipped. float64 models are left alone, and float32 ones but
for the float32 kernel above (their products do not reorder).

Inside ``torch.compile`` (the compiled step, ``decoding/compiled.py``) a packed layer takes its
packed weight for 2 to :data:`PACK_MAX_ROWS` rows through :func:`packed_linear`, an operator of
our own: inductor's lowering of oneDNN's ``_linear_pointwise`` accepts only weights frozen into
the graph as constants (ours are graph inputs: one graph serves every layer), and its pattern
passes would fuse the residual add into the product, which rounds once where the eager layer
rounds twice. Our operator is opaque to both, so the graph calls the same kernel as the eager
layer. One row keeps ``F.linear``: inductor turns that product into a fused streaming
reduction, which was not slower than the packed kernel (measured on a Xeon with AMX,
2026-12-05, ``/tmp`` script: a compiled plain step 40-45 ms with it, 47 ms packed). Measured
there, one thread, SmolLM2-135M in bfloat16, compiled steps after 64 / 800 cached tokens,
``aten::mm`` against packed: 2 slots 54 / 61 ms against 45 / 54 ms, 16 slots 59 / 74 ms against
51 / 68 ms; the logits of a 16-slot step bit-identical. Decoding: docs/results/README.md
("Half precision, round 3").

**AMX** (since 2026-12-07). On an Intel Xeon with ``amx_bf16`` (one thread,
``benchmarks/rows_kernel.py --parts products``: all 211 products of SmolLM2) our rows kernel
beats oneDNN's prepacked product for 1-6 rows (1.25x at one row, 1.08x at six) and lost from
seven (0.82x at 7, 0.74x at 8, 0.53x at 16): past 6 rows the kernel runs a second chunk of
rows (``rows_bf16.c``) and its cost steps up, while oneDNN's AMX tiles take 16 rows for about
the price of one. Since the kernel prefetches the next group's weights (``rows.SCHEDULE``,
2026-12-07) it beats oneDNN's AMX product up to 8 rows too (1.24x at 7, 1.06-1.19x at 8), ties
at 9 and loses from 10 (0.90x at 10, 0.64-0.68x at 16). So on such a CPU :func:`pack_linears` keeps
oneDNN's copy too (a third copy of the weights, counted against :data:`MEMORY_SHARE`) and a
product of :func:`amx_from_rows` rows or more (9; 7 in the schedule without the prefetch)
takes it, in eager steps and in the compiled graphs alike (the row count is static there).
The price: rows of such a product are no longer row-invariant (oneDNN's blocking changes with
the row count), so a token verified among 9-16 rows may round differently from the same token
alone, as before the rows kernel; ``TSS_AMX_ROWS=0`` keeps the rows kernel for every row count
(row-invariant, slower to verify). On CPUs without AMX (the EPYCs) nothing changes.
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

from tss_opt.decoding.kernels import rows, rows_f32
from tss_opt.models.precision import cpu_flags

log = logging.getLogger(__name__)

__all__ = [
    "AMX_FROM_ROWS",
    "AMX_FROM_ROWS_EARLIER",
    "GRAPH_MIN_ROWS",
    "PACK_MAX_ROWS",
    "amx_from_rows",
    "amx_reason",
    "is_packed",
    "pack_linears",
    "packed_kernel",
    "packed_linear",
    "packed_linears",
    "packing_supported",
]

PACK_MAX_ROWS = 16
"""Rows (tokens) up to which a layer uses its prepacked weight: the measured range where the
outputs equal ``F.linear``'s bit for bit (module docstring)."""

GRAPH_MIN_ROWS = 2
"""Inside a compiled graph, rows from which a layer uses its prepacked weight (one row is
inductor's fused reduction, module docstring)."""

AMX_FROM_ROWS = 9
"""Where oneDNN has AMX, products of this many rows or more (up to :data:`PACK_MAX_ROWS`) take
oneDNN's prepacked weight rather than our rows kernel, while the kernel prefetches the next
group's weights (``rows.SCHEDULE`` ``prefetch`` or ``blocks``; module docstring: the kernel
measured faster up to 8 rows, as fast at 9, slower from 10)."""

AMX_FROM_ROWS_EARLIER = 7
"""The same in the ``earlier`` schedule (``TSS_ROWS_STREAM=0``), no prefetch: the kernel measured
faster up to 6 rows, slower from 7."""

AMX_FLAG = "amx_bf16"
"""The ``/proc/cpuinfo`` flag of the AMX tiles oneDNN's bfloat16 products use."""

MEMORY_SHARE = 0.25
"""The packed copies may take at most this share of the memory available when packing; a
larger model keeps ``F.linear`` (and says so once) rather than risk the machine's memory."""

_ACTIVE: ContextVar[bool] = ContextVar("tss_packed_linears", default=False)
_PACKED = "_tss_packed_weight"
_WIDE = "_tss_packed_wide"  # oneDNN's copy beside the rows kernel's, for _WIDE_FROM rows or more
# The rows from which that copy takes a product: amx_from_rows() when packed, fixed then so a
# compiled graph and an eager step of the layer agree. An int of its own: with the copy in a
# tuple, the compiled plain step of such a target ran 1.2x slower (2026-12-07, Xeon).
_WIDE_FROM = "_tss_packed_wide_from"


def packing_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether prepacked products apply: bfloat16 on a CPU whose oneDNN computes bfloat16."""
    if device.type != "cpu" or dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    try:
        return bool(ops._is_mkldnn_bf16_supported()) and hasattr(ops, "_reorder_linear_weight")
    except (AttributeError, RuntimeError):
        return False


# ``tss_opt::packed_linear``: oneDNN's prepacked product as an operator inductor neither lowers
# nor pattern-matches (module docstring); the weight is oneDNN's opaque tensor, hence the
# MkldnnCPU kernel beside the CPU one.
_LIB = torch.library.Library("tss_opt", "DEF")
_LIB.define("packed_linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor")


def _packed_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The product on a prepacked weight, what both the eager forward and the operator run: our
    rows kernel on its 4-D layout (``kernels/rows.py``), else oneDNN's on its opaque tensor."""
    if packed.dim() == 4:
        return rows.rows_linear(x, packed, bias)
    if packed.dtype == torch.float32:  # the layer's own weight, read in place by our float32 kernel
        return rows_f32.rows_linear_f32(x, packed, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


for _key in ("CPU", "MkldnnCPU"):
    # Looked up at call time, so a test can count the products of a compiled graph too.
    _LIB.impl("packed_linear", lambda x, packed, bias: _packed_product(x, packed, bias), _key)


@torch.library.register_fake("tss_opt::packed_linear", lib=_LIB)
def _packed_linear_fake(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out_features = packed.shape[0] * packed.shape[2] if packed.dim() == 4 else packed.shape[0]
    return x.new_empty((*x.shape[:-1], out_features))


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through the weight prepacked by :func:`pack_linears`.

    Args:
        x: ``(..., in_features)`` in the packed weight's dtype.
        packed: the layer's prepacked weight: the rows kernel's ``(out / 16, in / 2, 16, 2)`` or
            oneDNN's opaque tensor (``(out_features, in_features)``).
        bias: ``(out_features,)`` or ``None``.

    Returns:
        ``(..., out_features)``.
    """
    return torch.ops.tss_opt.packed_linear(x, packed, bias)


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The layer's forward once packed: the prepacked product for a step's few rows of the
    packed dtype (inside :func:`packed_linears`, or inside a compiled graph from
    :data:`GRAPH_MIN_ROWS` rows), ``F.linear`` otherwise."""
    packed = getattr(self, _PACKED)
    if torch.compiler.is_compiling():  # before the context variable, which dynamo must not trace
        # Shapes are static in our graphs (``dynamic=False``): the row count is a constant.
        if _fits(self, x, packed) and x.numel() >= GRAPH_MIN_ROWS * self.in_features:
            return packed_linear(x, _for_rows(self, x, packed), self.bias)
    elif _ACTIVE.get() and _fits(self, x, packed):  # the context first: F.linear's callers pay nothing
        return _packed_product(x, _for_rows(self, x, packed), self.bias)
    return F.linear(x, self.weight, self.bias)


def _for_rows(layer: torch.nn.Linear, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """The packed weight for ``x``'s rows: oneDNN's copy from :func:`amx_from_rows` rows (as
    when the layer was packed) where the layer holds one (AMX, module docstring), else
    ``packed``. Looked up only on the packed paths, so a graph of one row never reads it."""
    wide = getattr(layer, _WIDE, None)
    return wide if wide is not None and x.numel() >= getattr(layer, _WIDE_FROM) * layer.in_features else packed


def amx_from_rows() -> int:
    """Rows from which oneDNN's AMX copy takes a product (where a layer holds one), for a layer
    packed now: :data:`AMX_FROM_ROWS`, or :data:`AMX_FROM_ROWS_EARLIER` in the schedule that does
    not prefetch (``TSS_ROWS_STREAM=0``)."""
    return AMX_FROM_ROWS if rows.SCHEDULES[rows.SCHEDULE] & rows.PREFETCH else AMX_FROM_ROWS_EARLIER


def _fits(layer: torch.nn.Linear, x: torch.Tensor, packed: torch.Tensor) -> bool:
    """At most :data:`PACK_MAX_ROWS` rows, in the packed dtype (dtypes checked too: a model
    cast after packing, ``model.float()``, keeps ``F.linear``), and no gradient asked for (the
    kernels have no backward: a forward that trains keeps ``F.linear``)."""
    return (
        x.dtype == packed.dtype == layer.weight.dtype
        and x.numel() <= PACK_MAX_ROWS * layer.in_features
        and not (torch.is_grad_enabled() and (x.requires_grad or layer.weight.requires_grad))
    )


def _available_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def amx_reason() -> str | None:
    """Why products of :data:`AMX_FROM_ROWS` rows or more stay with our rows kernel here
    (``TSS_AMX_ROWS=0``, no AMX), or ``None`` where oneDNN's AMX product takes them."""
    if os.environ.get("TSS_AMX_ROWS", "1") == "0":
        return "TSS_AMX_ROWS=0"
    if AMX_FLAG not in cpu_flags():
        return f"the CPU lacks {AMX_FLAG}"
    return None


@torch.no_grad()
def pack_linears(model: Any) -> int:
    """Reorder every ``nn.Linear`` weight of ``model`` once for oneDNN or our bfloat16 rows
    kernel (bfloat16 on a CPU), or hand float32 ones to our float32 rows kernel (in place, no
    copy; one thread, a CPU with AVX2 and FMA), and install the forward that uses them inside
    :func:`packed_linears`. Anything else is left alone. Idempotent.

    Returns:
        The number of layers packed (0 where packing does not apply or the bfloat16 copies do
        not fit in :data:`MEMORY_SHARE` of the available memory).
    """
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    done = _take_float32(linears)
    todo = [m for m in linears if not hasattr(m, _PACKED) and packing_supported(m.weight.device, m.weight.dtype)]
    if not todo:
        return done
    need = sum(m.weight.numel() * m.weight.element_size() for m in todo)
    avail = _available_bytes()
    if avail and need > MEMORY_SHARE * avail:
        log.info("bfloat16 linear layers kept unpacked: their packed copies (%.0f MB) would take more than "
                 "%.0f %% of the available memory (%.0f MB)", need / 1e6, 100 * MEMORY_SHARE, avail / 1e6)
        return 0
    # Our rows kernel where it runs and the target computes on one thread (it is
    # single-threaded; on two threads oneDNN's products of 4-16 rows were as fast as its one
    # thread or faster, and oneDNN scales further): the same values, each weight read once
    # (kernels/rows.py). Decided once, here.
    use_rows = torch.get_num_threads() == 1 and rows.available()
    # Where oneDNN has AMX, its copy beside ours for the wider products (module docstring), if
    # a second copy fits too.
    amx = amx_reason() if use_rows else "one thread and our rows kernel needed"
    if amx is None and avail and 2 * need > MEMORY_SHARE * avail:
        amx = f"a second packed copy ({need / 1e6:.0f} MB) would not fit in {100 * MEMORY_SHARE:.0f} % of the available memory"
    kernels = {"rows": 0, "oneDNN": 0}
    for m in todo:
        mine = use_rows and rows.fits(m.weight)
        # A plain attribute, not a buffer: state_dict, save_pretrained and exports never see it.
        setattr(m, _PACKED, rows.pack(m.weight) if mine else torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), 1))
        if mine and amx is None:
            setattr(m, _WIDE, torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), 1))
            setattr(m, _WIDE_FROM, amx_from_rows())
        m.forward = types.MethodType(_forward, m)
        kernels["rows" if mine else "oneDNN"] += 1
    wide = f"; oneDNN's AMX product from {amx_from_rows()} rows" if kernels["rows"] and amx is None else ""
    log.info("bfloat16 step products prepacked (%.0f MB): %s%s", need / 1e6,
             ", ".join(f"{n} layers for {k}" for k, n in kernels.items() if n), wide)
    if kernels["rows"] and amx is not None and AMX_FLAG in cpu_flags():
        log.info("bfloat16 products of %d-%d rows through our rows kernel, not oneDNN's AMX product: %s",
                 amx_from_rows(), PACK_MAX_ROWS, amx)
    return done + len(todo)


def _take_float32(linears: list[torch.nn.Linear]) -> int:
    """float32 layers on a CPU, where our float32 rows kernel runs and the target computes on
    one thread (the kernel is single-threaded; MKL scales with threads): their "packed" weight
    is the layer's own, read in place (a view, no copy: kernels/rows_f32.py). Returns how many."""
    todo = [m for m in linears if not hasattr(m, _PACKED) and rows_f32.fits(m.weight)]
    if not todo or torch.get_num_threads() != 1 or not rows_f32.available():
        return 0
    for m in todo:
        setattr(m, _PACKED, m.weight.detach())
        m.forward = types.MethodType(_forward, m)
    log.info("float32 step products through our float32 rows kernel: %d layers", len(todo))
    return len(todo)


def packed_kernel(model: Any) -> str | None:
    """``"rows"`` where any linear layer of ``model`` runs one of our rows kernels (bfloat16 or
    float32), ``"rows+amx"`` where its wider products take oneDNN's AMX product (module
    docstring), ``"onednn"`` where they are packed for oneDNN only, ``None`` where none is
    packed (latency tables are keyed by it, decoding/sizing/latency.py: the kernels cost
    differently)."""
    # The bfloat16 rows kernel's layout is a dense 4-D tensor; oneDNN's is its opaque 2-D one;
    # the float32 rows kernel reads the layer's own float32 weight.
    held = [getattr(m, _PACKED) for m in model.modules() if isinstance(m, torch.nn.Linear) and hasattr(m, _PACKED)]
    if not held:
        return None
    if any(isinstance(m, torch.nn.Linear) and hasattr(m, _WIDE) for m in model.modules()):
        return "rows+amx"
    return "rows" if any(p.dim() == 4 or p.dtype == torch.float32 for p in held) else "onednn"


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
