"""Our float32 product for a step's few rows (``rows_f32.c``), built at first use.

On a CPU without bfloat16 dot products (an AMD EPYC with AVX2 and no AVX-512, 2026-12-06, one
thread, ``benchmarks/rows_kernel.py --dtype float32``) the decoding commands run float32, and
MKL's product of 2 to 16 rows streams SmolLM2's weights far slower than its one-row product:
a step that verifies one draft token cost 1.4-1.6x a plain step
(docs/results/float32_products_epyc_avx2.md), so speculation barely paid on long prompts.
``rows_f32.c`` reads each weight once for all of a step's rows, straight from the layer's own
``(out, in)`` weight (no packed copy, no extra memory), with AVX2 and FMA.

It is built and cached like the bfloat16 rows kernel (:func:`tss_opt.decoding.kernels.rows.load`;
its own flags), and ``TSS_ROWS_KERNEL=0`` turns both off. It reads the weights in the
schedule the bfloat16 kernel does (:data:`tss_opt.decoding.kernels.rows.SCHEDULE`, per CPU):
on an AMD EPYC with AVX-512 (Zen 4) ``blocks`` was 1.45-1.75x faster than the earlier schedule
for 1-4 rows and 1.19-1.33x for 8-16; on an Intel Xeon with AMX ``prefetch`` 1.04-1.23x for 1-2
rows and 1.08-1.17x for 4-16 (``rows_f32.c``). Where the CPU lacks AVX2 or FMA, no compiler is
found or the build fails, :func:`library` returns ``None`` and says why once (INFO): float32
layers keep ``F.linear``.

The product is **row-invariant**: each output element is one 8-lane float32 accumulator over
the inputs in order, summed across its lanes in a fixed order, whatever the row count, so a
token verified among 16 rows gets the same bits as alone (MKL's products change their kernel
with the row count). Its values differ from MKL's in the last places (a different summation
order; closer to a float64 product on random inputs, ``tests/decoding/test_rows_f32_kernel.py``).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path

import torch

from tss_opt.decoding.kernels import rows

log = logging.getLogger(__name__)

__all__ = ["available", "fits", "library", "rows_linear_f32", "unavailable_reason"]

SOURCE = Path(__file__).with_name("rows_f32.c")
FLAGS: tuple[str, ...] = ("-O3", "-mavx2", "-mfma", "-shared", "-fPIC")
NEEDED_FLAGS: tuple[str, ...] = ("avx2", "fma")
"""``/proc/cpuinfo`` flags the compiled code uses."""


def unavailable_reason() -> str | None:
    """Why the kernel cannot run here (``None`` where it can be built): the switch shared with
    the bfloat16 rows kernel, the CPU flags, or the compiler."""
    if os.environ.get("TSS_ROWS_KERNEL", "1") == "0":
        return "TSS_ROWS_KERNEL=0"
    return rows.machine_reason(NEEDED_FLAGS)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernel, built on first call; ``None`` (said once, INFO) where it cannot run."""
    lib, reason = rows.load(SOURCE, unavailable_reason(), FLAGS)
    if lib is None:
        log.info("float32 step products through F.linear, not our rows kernel: %s", reason)
        return None
    fn = lib.tss_rows_linear_f32
    p, n = ctypes.c_void_p, ctypes.c_long
    fn.argtypes = [p, n, n, p, n, p, p, n, n, n, ctypes.c_int]
    fn.restype = ctypes.c_int
    return lib


def available() -> bool:
    """Whether the kernel runs here (builds it on first call)."""
    return library() is not None


def fits(weight: torch.Tensor) -> bool:
    """Whether ``weight`` (``(out_features, in_features)``) is one the kernel reads in place:
    float32 on the CPU, rows contiguous."""
    return (
        weight.dim() == 2
        and weight.dtype == torch.float32
        and weight.is_cpu
        and weight.stride(-1) == 1
        and weight.shape[0] > 0
        and weight.shape[1] > 0
    )


def rows_linear_f32(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through the kernel.

    Args:
        x: ``(..., K)`` float32 on the CPU.
        weight: ``(N, K)`` float32, rows contiguous (:func:`fits`).
        bias: ``(N,)`` or ``None`` (added after the product, in float32).

    Returns:
        ``(..., N)`` float32.
    """
    lib = library()
    if lib is None:
        raise RuntimeError(f"float32 rows kernel unavailable: {unavailable_reason() or 'its build failed (see the INFO log)'}")
    if not fits(weight):
        raise ValueError(f"float32 rows kernel: weight {tuple(weight.shape)} {weight.dtype} on {weight.device} "
                         f"with strides {weight.stride()}; expected float32 (N, K) on the CPU with contiguous rows")
    n, k = weight.shape
    flat = rows.flat_rows(x, k, torch.float32, "float32 rows kernel")
    out = x.new_empty((*x.shape[:-1], n))
    m = flat.shape[0]
    if m == 0:
        return out
    b = None if bias is None else bias.detach().contiguous()
    rc = lib.tss_rows_linear_f32(flat.data_ptr(), flat.stride(0), m, weight.data_ptr(), weight.stride(0),
                                 None if b is None else b.data_ptr(), out.data_ptr(), n, n, k, rows.SCHEDULES[rows.SCHEDULE])
    if rc != 0:  # fits() admits only what the kernel takes; this is a bug, not bad input
        raise RuntimeError(f"float32 rows kernel rejected x {tuple(x.shape)} against weight {tuple(weight.shape)}")
    return out
