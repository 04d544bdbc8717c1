"""Loading a GGUF export into llama.cpp (llama-cpp-python, the ``llama`` extra), as the checks
and benchmarks that run llama.cpp on our exports do.

One workaround lives here, with every use of llama-cpp-python's internals it needs. llama.cpp's
CPU backend moves weights into "extra buffer types" at load (weight repacking); on a CPU with
AMX (``amx_int8``) the AMX buffer type takes the quantized types it has kernels for, q8_0
among them. With llama-cpp-python 0.3.36 (its vendored llama.cpp built with native flags), our
q8_0 export of SmolLM2-135M segfaults in ``llama_decode`` on the first prompt (measured
2026-12-04 on an Intel Xeon with ``amx_int8``/``amx_bf16``, one thread; on the AMD EPYC of
earlier runs, without AMX, it decodes), while the same file with extra buffer types off, and
the f32, f16 and bf16 files either way, decode. So a *quantized* file on a CPU with AMX is
loaded with ``use_extra_bufts = False`` (llama.cpp's generic CPU kernels: correct, slower),
and the caller is told through :attr:`LlamaLoad.repacking`. llama.cpp's own tools on such a CPU
need the same (docs/mapping.md, "A GGUF file for llama.cpp").
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tss_opt.models.precision import cpu_flags

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["AMX_FLAG", "LlamaLoad", "open_llama", "repacking_crashes"]

AMX_FLAG = "amx_int8"
"""The ``/proc/cpuinfo`` flag of the CPUs whose AMX weight repacking crashes on q8_0."""


@dataclass
class LlamaLoad:
    """A loaded ``llama_cpp.Llama`` and whether llama.cpp repacked its weights.

    Attributes:
        llm: the ``llama_cpp.Llama``.
        repacking: False where :func:`repacking_crashes` turned weight repacking off.
    """

    llm: Any
    repacking: bool


def repacking_crashes(quantized: bool, flags: frozenset[str] | None = None) -> bool:
    """Whether llama.cpp's weight repacking must be off: a quantized file on a CPU with AMX
    (module docstring). ``flags``: the CPU's flags (default: this machine's)."""
    return quantized and AMX_FLAG in (cpu_flags() if flags is None else flags)


@contextmanager
def _no_extra_buffer_types() -> Iterator[None]:
    """Loads in the body get ``use_extra_bufts = False``: ``Llama.__init__`` takes its model
    parameters from ``llama_model_default_params()`` and has no argument for this field."""
    import llama_cpp.llama_cpp as lib

    default = lib.llama_model_default_params

    def without() -> Any:
        params = default()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = without
    try:
        yield
    finally:
        lib.llama_model_default_params = default


def open_llama(path: str, *, quantized: bool, **kwargs: Any) -> LlamaLoad:
    """``llama_cpp.Llama(model_path=path, **kwargs)``, with weight repacking off where it
    crashes (:func:`repacking_crashes`).

    Args:
        path: the GGUF file.
        quantized: whether its matrices are a quantized type (q8_0, q4_*...), not f32/f16/bf16.
    """
    from llama_cpp import Llama

    if not repacking_crashes(quantized):
        return LlamaLoad(Llama(model_path=path, **kwargs), repacking=True)
    with _no_extra_buffer_types():
        return LlamaLoad(Llama(model_path=path, **kwargs), repacking=False)
