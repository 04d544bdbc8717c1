"""Our bfloat16 product for a step's few rows (``rows_bf16.c``), built at first use.

On a CPU with AVX-512 BF16 and no AMX (an AMD EPYC of family 25, 2026-12-06, one thread,
``benchmarks/rows_kernel.py``), oneDNN's prepacked bfloat16 products of 1 to 8 rows stream
SmolLM2's weights at about 11 GB/s where a plain sum of them reads 20, so a step that verifies
a draft costs well over a plain one. ``rows_bf16.c`` keeps a tile of weights in registers for
every row of the step and reads each weight once: 1-4 rows at the sum's rate.

The C file is compiled here with the system's C compiler (``$CC``, else ``cc``; about 3 s) into
a per-user cache (``$TSS_KERNEL_CACHE``, else ``~/.cache/tss_opt/kernels``), named by a hash of
the source, the flags and the compiler, and loaded with ``ctypes``; concurrent processes each
write their own temporary file and rename it into place. Where the CPU lacks the instructions,
no compiler is found, or the build fails, :func:`library` returns ``None`` and says why once
(INFO): the caller keeps oneDNN. ``TSS_ROWS_KERNEL=0`` turns it off.

The product is **row-invariant**: each output element is one float32 accumulator over the
input's pairs in order, whatever the row count, so a token verified among 16 rows gets the same
bits as alone (oneDNN's products change their blocking with the row count: 13 rows differed
from 1 row in the last place, same script). Its values equal oneDNN's one-row product's where
oneDNN computes with AVX-512 BF16 (the EPYCs); on AMX tiles oneDNN sums in another order, within
the last place (an Intel Xeon with ``amx_bf16``, 2026-12-07). On such a CPU oneDNN's AMX product
is faster from 10 rows (from 7 in the earlier schedule), and ``decoding/linear.py`` gives it
the products of 9 rows or more (7 or more).

Both kernels of ours (this one and ``rows_f32.c``) follow a **schedule** chosen per CPU
(:data:`SCHEDULE`, since 2026-12-07), the order in which they read the weights; every schedule
computes each output with the same instructions, so the bits never depend on it:

- ``blocks`` (AMD with AVX-512): a step of few rows (bfloat16 1-4, float32 1-2) goes through the weights one
  block of outputs at a time, in memory order, one stream the hardware's prefetch follows best;
  wider steps take groups of output blocks and ask for the next group's weights while they
  compute the current one (a software prefetch). On an AMD EPYC with AVX-512 (Zen 4) 1.09-1.75x
  faster products than the earlier schedule.
- ``prefetch`` (every other vendor): the groups for every row count, each prefetching the next
  (bfloat16 from two rows). On an Intel Xeon with AMX (2026-12-07) one block at a time ran
  1-4 bfloat16 rows 1.04-1.45x slower than this and one float32 row 1.14x slower; against
  the earlier schedule this was level for 1-4 bfloat16 rows (0.97-1.04x), 1.04-1.21x faster
  for 1-2 float32 rows and 1.08-1.48x on wider steps (three runs).
- ``ahead`` (AMD without AVX-512: Zen 2 and 3): ``blocks``, where two float32 rows also
  prefetch the weights two outputs ahead. On a Zen 3 EPYC (2026-12-07, five runs) two rows ran
  1.10-1.14x faster than in ``blocks`` and one row, which does not prefetch, alike; ``blocks``
  itself was 1.00-1.10x faster than the earlier schedule there at one row (six runs). Our
  bfloat16 kernel, which needs AVX-512, reads as in ``blocks``.
- ``earlier``: the groups, no prefetch: the schedule before 2026-12-07.

``TSS_ROWS_STREAM`` overrides the choice: ``0`` (``earlier``), ``blocks``, ``prefetch`` or
``ahead``; unset, ``1`` or ``auto`` choose by the CPU's vendor and flags
(:func:`default_schedule`). The C files say what was measured.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from tss_opt.models.precision import cpu_flags, cpu_vendor

log = logging.getLogger(__name__)

__all__ = [
    "BLOCK", "SCHEDULE", "SCHEDULES", "available", "default_schedule", "fits", "flat_rows", "library", "load",
    "machine_reason", "pack", "rows_linear", "schedule_from", "unavailable_reason",
]

SOURCE = Path(__file__).with_name("rows_bf16.c")
FLAGS: tuple[str, ...] = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-shared", "-fPIC")
NEEDED_FLAGS: tuple[str, ...] = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")
"""``/proc/cpuinfo`` flags the compiled code uses."""
BLOCK = 16
"""Outputs per block of the packed layout (one 512-bit float32 accumulator)."""
BUILD_TIMEOUT_S = 120
ONE_BLOCK, PREFETCH, AHEAD = 1, 2, 4
"""The C kernels' ``schedule`` bits: few rows one block of outputs at a time; the groups of
output blocks prefetch the next group's weights; two float32 rows one output at a time prefetch
the output two ahead (``rows_f32.c`` only)."""
SCHEDULES: dict[str, int] = {"earlier": 0, "blocks": ONE_BLOCK | PREFETCH, "prefetch": PREFETCH,
                             "ahead": ONE_BLOCK | PREFETCH | AHEAD}
"""Each schedule (module docstring) as the bits our C kernels take."""
SCHEDULE_ALIASES: dict[str, str] = {"0": "earlier", "1": "auto"}
"""``TSS_ROWS_STREAM``'s spellings before there were several schedules (on and off)."""


def default_schedule(vendor: str, flags: frozenset[str]) -> str:
    """The schedule for a CPU of ``vendor`` (``/proc/cpuinfo``'s ``vendor_id``) with ``flags``:
    ``blocks`` on AMD with AVX-512 (measured fastest on Zen 4), ``ahead`` on AMD without (Zen 3),
    ``prefetch`` elsewhere (measured fastest on an Intel Xeon); none slower than the earlier
    schedule where it was measured."""
    if vendor == "AuthenticAMD":
        return "blocks" if "avx512f" in flags else "ahead"
    return "prefetch"


def schedule_from(value: str | None, vendor: str, flags: frozenset[str]) -> str:
    """The schedule ``TSS_ROWS_STREAM=value`` asks for on a CPU of ``vendor`` with ``flags``:
    unset, ``1`` and ``auto`` by the CPU (:func:`default_schedule`), ``0`` the earlier one. A
    value none of these is an error that names it and what would do."""
    given = (value or "auto").strip()
    name = SCHEDULE_ALIASES.get(given, given)
    if name == "auto":
        return default_schedule(vendor, flags)
    if name not in SCHEDULES:
        raise ValueError(f"TSS_ROWS_STREAM={value!r}: expected auto, 1, 0 (earlier), blocks, prefetch or ahead"
                         " (unset: auto, by the CPU); set it to one of those or unset it")
    return name


SCHEDULE: str = schedule_from(os.environ.get("TSS_ROWS_STREAM"), cpu_vendor(), cpu_flags())
"""The schedule our kernels read the weights in (module docstring); read at every call, so a
benchmark can compare schedules in one process (``benchmarks/rows_kernel.py``). Latency tables
are keyed by it (``decoding/sizing/latency.py``)."""


def _cache_dir() -> Path:
    root = os.environ.get("TSS_KERNEL_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tss_opt" / "kernels"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def unavailable_reason() -> str | None:
    """Why the kernel cannot run here (``None`` where it can be built): the switch, the CPU
    flags, or the compiler. A failed build is reported by :func:`library`."""
    if os.environ.get("TSS_ROWS_KERNEL", "1") == "0":
        return "TSS_ROWS_KERNEL=0"
    return machine_reason()


def machine_reason(needed: tuple[str, ...] = NEEDED_FLAGS) -> str | None:
    """Why a kernel of ours needing the CPU flags ``needed`` (default: the AVX-512 BF16 ones)
    cannot be built here (the flags, the compiler), or ``None``."""
    missing = [f for f in needed if f not in cpu_flags()]
    if missing:
        return f"the CPU lacks {', '.join(missing)}"
    if _compiler() is None:
        return f"no C compiler ({os.environ.get('CC', 'cc')}, gcc) on PATH"
    return None


def _build(cc: str, source: Path = SOURCE, flags: tuple[str, ...] = FLAGS) -> Path:
    """Compile ``source`` (``rows_bf16.c`` or another kernel of ours) with ``flags`` into the
    cache unless a build of the same source, flags and compiler is there; returns the shared
    library's path."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    digest = hashlib.sha256("\0".join([source.read_text(), *flags, cc, version]).encode()).hexdigest()[:16]
    cache = _cache_dir()
    target = cache / f"{source.stem}-{digest}.so"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    # Its own temporary name, then an atomic rename: two processes building at once (CI's two
    # suites) never load a half-written file.
    fd, tmp = tempfile.mkstemp(prefix=f"{source.stem}-", suffix=".so.tmp", dir=cache)
    os.close(fd)
    try:
        done = subprocess.run([cc, *flags, str(source), "-o", tmp], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} exited {done.returncode}: {done.stderr.strip()[-500:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load(source: Path, reason: str | None, flags: tuple[str, ...] = FLAGS) -> tuple[ctypes.CDLL | None, str | None]:
    """Build (:func:`_build`, with ``flags``) and load the kernel ``source`` unless ``reason``
    says why it cannot run here; returns the library, or ``None`` and the reason (a failed build
    included)."""
    if reason is not None:
        return None, reason
    try:
        return ctypes.CDLL(str(_build(_compiler() or "cc", source, flags))), None
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return None, f"building {source.name} failed ({exc})"


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernel, built on first call; ``None`` (said once, INFO) where it cannot run."""
    lib, reason = load(SOURCE, unavailable_reason())
    if lib is None:
        log.info("bfloat16 step products through oneDNN, not our rows kernel: %s", reason)
        return None
    fn = lib.tss_rows_linear
    p, n = ctypes.c_void_p, ctypes.c_long
    fn.argtypes = [p, n, n, p, p, p, n, n, n, ctypes.c_int]
    fn.restype = ctypes.c_int
    return lib


def available() -> bool:
    """Whether the kernel runs here (builds it on first call)."""
    return library() is not None


def fits(weight: torch.Tensor) -> bool:
    """Whether ``weight`` (``(out_features, in_features)``) has a shape the layout holds:
    bfloat16, outputs a multiple of :data:`BLOCK`, an even number of inputs."""
    return weight.dim() == 2 and weight.dtype == torch.bfloat16 and weight.shape[0] % BLOCK == 0 and weight.shape[1] % 2 == 0 and weight.shape[0] > 0


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``(N, K)`` in the kernel's layout: ``(N / 16, K / 2, 16, 2)``, contiguous (a copy)."""
    if not fits(weight):
        raise ValueError(f"rows kernel: weight of shape {tuple(weight.shape)} and dtype {weight.dtype} "
                         f"cannot be packed; expected bfloat16 (N, K) with N a multiple of {BLOCK} and K even")
    n, k = weight.shape
    return weight.detach().reshape(n // BLOCK, BLOCK, k // 2, 2).permute(0, 2, 1, 3).contiguous()


def flat_rows(x: torch.Tensor, k: int, dtype: torch.dtype, kernel: str) -> torch.Tensor:
    """``x`` ``(..., k)`` as the ``(M, k)`` rows a kernel of ours reads (each row contiguous; a
    view where it can be), after checking its dtype, width and device (``kernel`` names the
    kernel in the error)."""
    # Called for every product of a step (211 for SmolLM2): the cheapest checks first
    # (``is_cpu``, not ``device.type``), and a 2-D input with contiguous rows is used as it is.
    if x.dtype != dtype or x.shape[-1] != k or not x.is_cpu:
        raise ValueError(f"{kernel}: input {tuple(x.shape)} {x.dtype} on {x.device}; "
                         f"expected {str(dtype).removeprefix('torch.')} (..., {k}) on the CPU")
    flat = x if x.dim() == 2 else x.reshape(-1, k)
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def rows_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through the kernel, ``packed = pack(weight)``.

    Args:
        x: ``(..., K)`` bfloat16 on the CPU.
        packed: ``(N / 16, K / 2, 16, 2)`` from :func:`pack`.
        bias: ``(N,)`` or ``None`` (added in float32 before the one rounding to bfloat16).

    Returns:
        ``(..., N)`` bfloat16.
    """
    lib = library()
    if lib is None:
        raise RuntimeError(f"rows kernel unavailable: {unavailable_reason() or 'its build failed (see the INFO log)'}")
    n, k = packed.shape[0] * BLOCK, packed.shape[1] * 2
    rows = flat_rows(x, k, torch.bfloat16, "rows kernel")
    m = rows.shape[0]
    out = x.new_empty((*x.shape[:-1], n))
    if m == 0:
        return out
    b = None if bias is None else bias.detach().to(torch.float32).contiguous()
    rc = lib.tss_rows_linear(rows.data_ptr(), rows.stride(0), m, packed.data_ptr(),
                             None if b is None else b.data_ptr(), out.data_ptr(), n, n, k, SCHEDULES[SCHEDULE])
    if rc != 0:  # pack() admits only shapes the kernel takes; this is a bug, not bad input
        raise RuntimeError(f"rows kernel rejected x {tuple(x.shape)} against packed {tuple(packed.shape)}")
    return out
