"""``python -m tss_opt.cli.serve [host=127.0.0.1] [port=8000] [mapping_path=...]`` starts the
OpenAI-compatible HTTP server (docs/serving.md); with ``prompt="..." [request_domain=qa]`` it
answers one request and exits. ``backend=vllm`` starts vLLM's OpenAI server with the TSS plugin
instead (every argument after ``--`` goes to vLLM as given).

One request is served the way the runtime does: the domain's skip set from the mapping file
(``request_domain``, or detected by the domain router when it is not given; unknown domains
run dense), on one loaded model. Prints the chosen domain, the skip set, the output and the
request's statistics. See docs/runtime.md.
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from tss_opt.cli.common import hydra_entry
from tss_opt.cli.generate import format_stats
from tss_opt.config.enums import ServeBackend
from tss_opt.decoding.engine import GenerationResult
from tss_opt.errors import UsageError
from tss_opt.report.tables import format_skip_set
from tss_opt.runtime.controller import ControllerResult, TSSController
from tss_opt.runtime.router import BACKGROUND


def describe(res: ControllerResult, controller: TSSController) -> str:
    """The routing lines printed above the output."""
    r = res.route
    if r is not None and res.routed:
        how = f"routed: similarity {r.similarity:.3f} >= threshold {r.threshold:.3f}"
    elif r is not None and r.nearest == BACKGROUND:
        how = f"routed: closest to generic requests (similarity {r.similarity:.3f}), no domain: dense"
    elif r is not None:
        how = f"routed: nearest {r.nearest} but similarity {r.similarity:.3f} < threshold {r.threshold:.3f}: dense"
    elif res.domain is None:
        how = "no domain given and no router: dense"
    else:
        how = "from request_domain"
    mapped = res.domain in controller.domains if res.domain else False
    k = len(res.skip_set)
    lines = [
        f"domain: {res.domain or '(none)'} [{how}]" + ("" if mapped or res.domain is None else " — not in the mapping: dense"),
        f"skip set: {format_skip_set(res.skip_set)} ({k}/{controller.target.num_layers} layers skipped)",
    ]
    return "\n".join(lines)


def serve(cfg: DictConfig) -> ControllerResult | None:
    """With ``prompt=``: answer it and return the result; without: run the HTTP server until
    interrupted."""
    if str(cfg.get("backend") or ServeBackend.native) == ServeBackend.vllm:
        if cfg.get("prompt") is not None:
            raise UsageError(
                "backend=vllm starts vLLM's HTTP server; prompt= answers one request with the native "
                "controller: drop one of them"
            )
        from tss_opt.assembly.serving import build_vllm_launch
        from tss_opt.runtime.vllm_plugin.launch import exec_vllm

        exec_vllm(build_vllm_launch(cfg, _VLLM_ARGS))
        return None
    if _VLLM_ARGS:
        raise UsageError(f"arguments after `--` ({' '.join(_VLLM_ARGS)}) are vLLM's options: add backend=vllm")
    if cfg.get("prompt") is None:
        from tss_opt.assembly.serving import build_state
        from tss_opt.runtime.server import run_server

        run_server(build_state(cfg), str(cfg.get("log_level", "INFO")))
        return None
    if not str(cfg.prompt).strip():
        raise UsageError('the prompt is empty; give prompt="your text" (or no prompt= to start the HTTP server)')
    from tss_opt.assembly.serving import build_controller

    controller = build_controller(cfg)
    res = controller.generate(cfg.prompt, cfg.get("request_domain"))
    print(describe(res, controller))
    print()
    print(res.text)
    print()
    print(format_stats(GenerationResult(tokens=res.tokens, stats=res.stats)))
    return res


# vLLM's own options: everything after `--` (Hydra would read them as its own flags).
_VLLM_ARGS: list[str] = []
_hydra_main = hydra_entry(serve)


def main() -> None:
    if "--" in sys.argv:
        cut = sys.argv.index("--")
        _VLLM_ARGS[:] = sys.argv[cut + 1 :]
        sys.argv[:] = sys.argv[:cut]
    _hydra_main()


if __name__ == "__main__":
    main()
