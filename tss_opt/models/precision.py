"""``dtype: auto``: the floating-point type a target runs in, chosen from the hardware and the
command's purpose.

Two purposes want different precisions:

- ``decode`` (generate, serve, evaluate, profile): the fastest precision the device computes
  natively. On a CPU that is bfloat16 when its flags include native bf16 dot products
  (``avx512_bf16`` or ``amx_bf16``; measured on two such CPUs: SmolLM2-135M decodes
  1.4-1.8x faster in bfloat16 than in float32 on an AMD EPYC, and the server and the best
  drafter gain 1.2-1.7x on an Intel Xeon with AMX, whose eager one-row steps gain nothing;
  docs/configuration.md "dtype=auto"), float32 otherwise: without them every bf16 product is
  converted to float32, so products with rows (a prompt, a verified tree, a batch) run up to
  6x slower than in float32, while a one-row step, which mostly reads the weights, gains from
  reading half the bytes (an AMD EPYC with AVX2 only, ``benchmarks/precision_rows.py``: plain
  decoding 1.14x faster, a 64-token prefill 6x and 16 verified nodes 3.2x slower). On CUDA:
  bfloat16 where ``torch.cuda.is_bf16_supported()``, else float16 (the paper's setting).
- ``search`` (the study, compare, sweep, report, training): the precision its exactness rule
  needs. On a CPU that is float32: the replay evaluator reproduces the engine only in
  float32/float64 (:data:`tss_opt.evaluation.choice.EXACT_BATCHING`), and a study's identity
  records the dtype, so ``auto`` must name the same float32 study it always did. On CUDA the
  half type of ``decode`` (the paper searched in float16 on GPU).

An explicit dtype (``float32``, ``bfloat16``...) is never changed. :func:`choose_dtype` is a
pure function of its inputs (the CPU flags are injectable for tests);
:func:`resolve_model_dtype` applies it to a :class:`~tss_opt.config.ModelConfig` and logs the
one INFO line that says what ``auto`` chose and why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from tss_opt.config.model import ModelConfig

log = logging.getLogger(__name__)

__all__ = [
    "AUTO",
    "BF16_CPU_FLAGS",
    "PURPOSES",
    "DtypeChoice",
    "Purpose",
    "choose_dtype",
    "cpu_flags",
    "cpu_vendor",
    "resolve_model_dtype",
]

AUTO = "auto"
"""The ``model.dtype`` value that asks :func:`choose_dtype` to decide."""

BF16_CPU_FLAGS: tuple[str, ...] = ("avx512_bf16", "amx_bf16")
"""``/proc/cpuinfo`` flags of native bfloat16 dot products (AVX512-BF16's ``vdpbf16ps``,
AMX's tile multiply): oneDNN runs bf16 matmuls on them; without them every bf16 product is
converted to float32, and products with rows (prompts, verification, batches) are slower than
in float32."""

Purpose = Literal["decode", "search"]
PURPOSES: tuple[str, ...] = ("decode", "search")


@dataclass(frozen=True)
class DtypeChoice:
    """What a dtype setting resolved to, and why.

    Attributes:
        dtype: A concrete dtype name (``float32``, ``bfloat16``, ``float16``, ``float64``).
        reason: One clause saying why (the flag found, the purpose, or "set explicitly").
        auto: Whether the setting was ``auto`` (only then is the choice logged).
    """

    dtype: str
    reason: str
    auto: bool = False

    @property
    def message(self) -> str:
        """The one log line, e.g. ``dtype=auto: bfloat16 on cpu, because the CPU flags include
        avx512_bf16 (native bf16 dot products)``."""
        return f"dtype=auto: {self.dtype}, because {self.reason}"


def _cpuinfo_field(keys: tuple[str, ...], cpuinfo: str | Path) -> str | None:
    """The value of the first ``/proc/cpuinfo`` line whose key is one of ``keys``; ``None`` where
    the file is missing or unreadable (not Linux) or no line has such a key."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys:
            return value
    return None


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (the first ``flags`` line of ``/proc/cpuinfo``); empty where the
    file is missing or unreadable (not Linux), so ``auto`` then falls back to float32."""
    value = _cpuinfo_field(("flags", "Features"), cpuinfo)  # x86 / ARM spelling
    return frozenset(value.split()) if value is not None else frozenset()


def cpu_vendor(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's vendor (the first ``vendor_id`` line of ``/proc/cpuinfo``: ``GenuineIntel``,
    ``AuthenticAMD``, ...); empty where the file or the line is missing (not Linux, not x86)."""
    return (_cpuinfo_field(("vendor_id",), cpuinfo) or "").strip()


def _cuda_bf16() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def choose_dtype(
    setting: str,
    device: str,
    purpose: Purpose = "decode",
    *,
    flags: Iterable[str] | Callable[[], Iterable[str]] = cpu_flags,
    cuda_bf16: bool | Callable[[], bool] = _cuda_bf16,
) -> DtypeChoice:
    """The dtype a ``model.dtype`` setting means on ``device`` for ``purpose``.

    Args:
        setting: ``auto`` or a concrete dtype name (returned unchanged: explicit wins).
        device: The model's device (``cpu``, ``cuda``, ``cuda:1``...).
        purpose: ``decode`` (fastest native precision) or ``search`` (the precision the
            search's exactness rule needs: float32 on CPU).
        flags: The CPU flags, or a function returning them (default: :func:`cpu_flags`);
            read only for ``auto`` on a CPU with purpose ``decode``.
        cuda_bf16: Whether the GPU computes bfloat16, or a function answering it (default:
            ``torch.cuda.is_bf16_supported()``); read only for ``auto`` on CUDA.

    Raises:
        ValueError: ``purpose`` is neither ``decode`` nor ``search``.
    """
    if purpose not in PURPOSES:
        raise ValueError(f"purpose={purpose!r} is not a dtype purpose; expected one of {', '.join(PURPOSES)}")
    if setting != AUTO:
        return DtypeChoice(setting, "it was set explicitly")
    kind = str(device).split(":")[0]
    if kind == "cuda":
        has_bf16 = cuda_bf16() if callable(cuda_bf16) else bool(cuda_bf16)
        half = "bfloat16" if has_bf16 else "float16"
        why = "supports bfloat16" if has_bf16 else "does not support bfloat16 (torch.cuda.is_bf16_supported())"
        return DtypeChoice(half, f"{purpose} on {device}: the GPU {why}", auto=True)
    if kind != "cpu":
        return DtypeChoice("float32", f"{purpose} on {device}: no half-precision rule for this device type", auto=True)
    if purpose == "search":
        return DtypeChoice(
            "float32",
            "a search on cpu keeps float32: its exactness rule (the replay evaluator, the study's "
            "identity) needs float32 there; set dtype=bfloat16 to search in bfloat16 anyway",
            auto=True,
        )
    found = set(flags() if callable(flags) else flags)
    native = [f for f in BF16_CPU_FLAGS if f in found]
    if native:
        return DtypeChoice(
            "bfloat16", f"decode on cpu: the CPU flags include {native[0]} (native bf16 dot products)", auto=True
        )
    return DtypeChoice(
        "float32",
        f"decode on cpu: the CPU flags include none of {', '.join(BF16_CPU_FLAGS)} (bfloat16 products "
        "would be converted to float32: prompts, verification and batches slower than in float32)",
        auto=True,
    )


_announced: set[str] = set()  # one INFO line per distinct choice: the identity and the load both resolve


def resolve_model_dtype(
    mc: ModelConfig,
    purpose: Purpose = "decode",
    *,
    flags: Iterable[str] | Callable[[], Iterable[str]] = cpu_flags,
    cuda_bf16: bool | Callable[[], bool] = _cuda_bf16,
) -> ModelConfig:
    """``mc`` with ``dtype: auto`` replaced by :func:`choose_dtype`'s answer (logged once at
    INFO); a concrete dtype returns ``mc`` itself."""
    if mc.dtype != AUTO:
        return mc
    choice = choose_dtype(mc.dtype, mc.device, purpose, flags=flags, cuda_bf16=cuda_bf16)
    if choice.message not in _announced:
        _announced.add(choice.message)
        log.info("%s", choice.message)
    return replace(mc, dtype=choice.dtype)
