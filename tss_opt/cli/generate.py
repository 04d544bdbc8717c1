"""``python -m tss_opt.cli.generate "prompt='...'" [skip=[3,5]] [drafter=pld] [+model=...]``

Quote the prompt for Hydra too when it holds commas or brackets: ``"prompt='a, b'"``.

Generates an answer with a chosen model, drafter and skip set, and prints the output and the
request's statistics.
"""

from __future__ import annotations

from omegaconf import DictConfig

from tss_opt.assembly import assemble, build_verifier
from tss_opt.cli.common import hydra_entry
from tss_opt.config.domain import DEFAULT_MAX_NEW_TOKENS
from tss_opt.decoding.drafters.taps import TapsDrafter, format_member_stats
from tss_opt.decoding.engine import GenerationResult, SpeculativeEngine
from tss_opt.errors import UsageError
from tss_opt.evaluation.domains import Example, format_prompt


def format_stats(res: GenerationResult) -> str:
    s = res.stats
    rows = [
        ("new tokens", f"{s.new_tokens}"),
        ("verification steps", f"{s.steps}"),
        ("accepted length (bonus incl.)", f"{s.accept_length:.3f}"),
        ("draft tokens proposed / accepted", f"{s.draft_proposed} / {s.draft_accepted}"),
        ("skipped layers", f"{s.skipped_layers} of {s.num_layers}"),
        ("target layer-forwards (prefill / verify)", f"{s.prefill_layer_forwards} / {s.verify_layer_forwards}"),
        ("time prefill / draft / verify / total (s)", f"{s.prefill_s:.3f} / {s.draft_s:.3f} / {s.verify_s:.3f} / {s.total_s:.3f}"),
        ("tokens/s", f"{s.tokens_per_s:.2f}"),
        ("verification", f"{s.verification}" + (f" (LOSSY: {s.relaxed_accepted} draft tokens kept by it)" if s.lossy else "")),
    ]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def generate(cfg: DictConfig) -> GenerationResult:
    if not cfg.get("prompt"):
        raise UsageError('no prompt given; add prompt="your text" (quote it for the shell)')
    rt = assemble(cfg)
    ids = format_prompt(rt.loaded.tokenizer, Example(id="cli", prompt=cfg.prompt, references=(), fields={}), None)
    drafter = rt.new_drafter()
    engine = SpeculativeEngine(
        rt.target, drafter, eos_token_ids=rt.eos_token_ids, verification=build_verifier(cfg, rt.drafter_cfg)
    )
    res = engine.generate(
        ids, max_new_tokens=int(cfg.get("max_new_tokens") or DEFAULT_MAX_NEW_TOKENS), skip=list(cfg.skip), scope=cfg.scope,
        temperature=float(cfg.temperature),
    )
    print(rt.loaded.tokenizer.decode(res.tokens, skip_special_tokens=True))
    print()
    print(f"model={rt.loaded.config.name} drafter={rt.drafter_cfg.get('name')} skip={sorted(cfg.skip)} scope={cfg.scope}")
    print(format_stats(res))
    if isinstance(drafter, TapsDrafter):  # drafter=routed / merged: per-member statistics
        print(format_member_stats(drafter))
    return res


main = hydra_entry(generate)

if __name__ == "__main__":
    main()
