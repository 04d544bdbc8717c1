"""String settings as Enums, so that Hydra validates them at compose time."""

from __future__ import annotations

from enum import Enum
from typing import Any

from tss_opt.errors import TSSError

__all__ = ["Cost", "ExportFormat", "GGUFOutType", "Scope", "ServeBackend", "StrEnum", "Verification"]


class StrEnum(str, Enum):
    """A string-valued Enum that prints as its value (``f"{Mode.beam}"`` is ``beam``).

    Hydra/OmegaConf validate Enum-typed config fields by member name, so a misspelt value fails
    at compose time with the options listed; member names equal their values so that
    ``mode=beam`` on the command line and ``Mode.beam == "beam"`` both hold.
    """

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    def __repr__(self) -> str:
        # Messages name values as users type them: mode='beam', not <Mode.beam: 'beam'>.
        return repr(str(self.value))

    @classmethod
    def parse(cls, name: str, value: Any) -> Any:
        """``value`` as a member of this Enum, or a :class:`TSSError` naming the options."""
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            options = ", ".join(m.value for m in cls)
            raise TSSError(f"Unknown {name} {value!r}; expected one of: {options}.") from None


class Scope(StrEnum):
    """Where the skip set applies: ``verify`` (dense prefill, sparse verification: the paper)
    or ``all`` (every target forward, prefill included)."""

    verify = "verify"
    all = "all"


class ServeBackend(StrEnum):
    """What serves HTTP requests (``python -m tss_opt.cli.serve backend=...``): ``native`` (our
    server: continuous batching with our drafters) or ``vllm`` (vLLM's OpenAI server with the
    TSS plugin; docs/serving.md, "Serving with vLLM")."""

    native = "native"
    vllm = "vllm"


class Cost(StrEnum):
    """How a trial's verification cost C(S) is measured: ``analytic`` (share of layer
    forwards kept, deterministic) or ``measured`` (timed verification forwards)."""

    analytic = "analytic"
    measured = "measured"


class Verification(StrEnum):
    """The acceptance rule of verification.

    ``exact`` (the default) keeps the target's output: greedy decoding's tokens at temperature
    0, the target's distribution above. ``diversed`` (lossy) also accepts a draft token against
    the blend ``w * p_target + (1 - w) * p_draft``; ``cospec`` (lossy) lets an arbitration
    policy keep the draft's token at the first mismatch of a step. Both need a drafter that
    gives a distribution (docs/engine.md, "Relaxed verification").
    """

    # Each rule says itself whether it is lossy (its output may differ from the target's own):
    # callers read ``rule.lossy``, never a comparison with a rule's name.
    lossy: bool

    def __new__(cls, value: str, lossy: bool) -> Verification:
        member = str.__new__(cls, value)
        member._value_ = value
        member.lossy = lossy
        return member

    exact = "exact", False
    diversed = "diversed", True
    cospec = "cospec", True

    @classmethod
    def lossy_label(cls, label: str) -> bool:
        """Whether the rule a label names is lossy.

        ``label``: a rule's label as stored in decode stats, results, study protocols and
        mapping entries (``Verifier.describe()`` / ``settings_label``: ``exact``,
        ``diversed(w=0.60)``, ``cospec(threshold)``); the rule is the part before ``(``. A
        label naming no known rule counts as lossy, the safe side: output is never presented
        as the target's own unless a lossless rule produced it.
        """
        rule = cls._value2member_map_.get(str(label).split("(", 1)[0].strip())
        return rule is None or bool(rule.lossy)  # type: ignore[attr-defined]


class ExportFormat(StrEnum):
    """What ``python -m tss_opt.cli.export_model`` writes: ``hf`` (a Hugging Face checkpoint
    folder) or ``gguf`` (one GGUF file for llama.cpp, Ollama, LM Studio; docs/mapping.md)."""

    hf = "hf"
    gguf = "gguf"


class GGUFOutType(StrEnum):
    """The tensor type of a GGUF export's matrices (1-D tensors, the norms, stay ``f32`` as in
    llama.cpp's own converter): ``f32`` (the weights our engine runs, exactly), ``f16``,
    ``bf16`` (the float32 weights rounded to bfloat16, as our engine's ``dtype=bfloat16``
    rounds them) or ``q8_0`` (8-bit blocks of 32 with one scale; llama.cpp's ``Q8_0``)."""

    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    q8_0 = "q8_0"

    @property
    def quantized(self) -> bool:
        """Whether the matrices are a quantized type (blocks with scales), not a float type:
        llama.cpp repacks those at load (tss_opt/mapping/llama_runner.py)."""
        return self not in (GGUFOutType.f32, GGUFOutType.f16, GGUFOutType.bf16)
