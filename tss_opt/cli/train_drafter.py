"""``python -m tss_opt.cli.train_drafter +domain=NAME drafter=eagle [train.max_minutes=30]``

Trains a drafter for the loaded target by self-distillation on the domain's training text
(calibration prompts, extra ``train_data`` records, the target's greedy continuations; never
validation or held-out prompts) and writes a checkpoint under
``<train.out_dir>/<model>/<domain>/`` that ``drafter=eagle drafter.checkpoint=PATH`` loads.

``train.general=true`` (no ``+domain``) trains one head on every domain together, saved under
``<model>/general/``; ``train.domains=[a,b]`` trains one head on those domains, saved under
``<model>/a+b/``. ``drafter.checkpoint=PATH`` writes the checkpoint to PATH instead.
``train.generated_tokens=N`` adds about N tokens of text the target samples itself from the
training prompts and generic chat prompts (data-free distillation, issue 23), and the
checkpoint keeps the ``train.draft_vocab`` most frequent tokens as its draft vocabulary.
Settings: ``train.*`` (tss_opt/config/train.py, docs/drafters.md).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tss_opt.assembly import Assembly, assemble, drafter_config, model_settings, require_domain
from tss_opt.cli.common import EXIT_INTERRUPTED, hydra_entry
from tss_opt.config.train import TrainSettings
from tss_opt.errors import UsageError

GENERAL = "general"


def train_settings(cfg: DictConfig) -> TrainSettings:
    """``cfg.train`` as a checked :class:`TrainSettings`."""
    from tss_opt.training.common import check_settings

    node = cfg.get("train")
    settings = OmegaConf.to_object(node) if node is not None else TrainSettings()
    if not isinstance(settings, TrainSettings):  # a plain mapping (configs composed without the schema)
        settings = TrainSettings(**dict(settings))
    check_settings(settings)
    return settings


def training_domains(cfg: DictConfig, settings: TrainSettings) -> tuple[str, list[Any]]:
    """``(label, domains)``: the ``+domain`` alone, or the domains of a multi-domain head.

    Raises:
        UsageError: no domain chosen, ``+domain`` together with ``train.general`` or
            ``train.domains``, an unknown domain name.
    """
    from tss_opt.config.search_path import domain_config_dirs
    from tss_opt.evaluation.domains import available_domains, load_domain, read_domain_config

    dirs = domain_config_dirs()
    known = available_domains(dirs)
    many = bool(settings.general or settings.domains)
    if cfg.get("domain") is not None:
        if many:
            raise UsageError(
                "+domain=NAME trains a head for one domain; train.general / train.domains train one head "
                "on several: give one or the other"
            )
        domain = require_domain(cfg)
        return domain.name, [domain]
    if not many:
        raise UsageError(
            f"no domain chosen; add +domain=NAME (available: {', '.join(known)}), or train.general=true "
            "for one head on every domain"
        )
    names = list(dict.fromkeys(str(n) for n in settings.domains)) or known
    domains = [load_domain(read_domain_config(n, dirs)) for n in names]
    label = GENERAL if sorted(names) == sorted(known) else "+".join(names)
    return label, domains


def train_drafter(cfg: DictConfig) -> Any:
    """Run the training command the chosen drafter's builder declares (``builds(trainer=...)``:
    ``eagle`` and ``t2d``, below)."""
    import importlib

    from tss_opt.decoding.drafters.registry import drafter_trainer, trainable_drafters

    settings = train_settings(cfg)
    drafter = drafter_config(cfg)
    trainer = drafter_trainer(drafter) if cfg.get("drafter") is not None else None
    if trainer is None:
        trainable = trainable_drafters()
        raise UsageError(
            f"train_drafter trains drafter={' or drafter='.join(trainable)}; got drafter={drafter.get('name')!r}"
            + (f" (the model's default; add drafter={trainable[0]})" if cfg.get("drafter") is None else "")
        )
    module, _, attr = trainer.rpartition(".")
    return getattr(importlib.import_module(module), attr)(cfg, settings, drafter)


def _probe_prompts(domains: list[Any], tokenizer: Any, n: int) -> list[Any]:
    """``n`` calibration prompts, round-robin over the domains (never validation/held out)."""
    from tss_opt.evaluation.domains import format_prompt

    queues = [d.split("calibration") for d in domains]
    out = []
    i = 0
    while len(out) < n and any(queues):
        q = queues[i % len(queues)]
        if q:
            ex = q.pop(0)
            out.append(format_prompt(tokenizer, ex, domains[i % len(queues)].config.system_prompt))
        i += 1
    return out


def train_eagle_command(cfg: DictConfig, settings: TrainSettings, drafter: dict[str, Any], runtime: Assembly | None = None) -> Any:
    """Prepare the text, extract features, train, print a summary; returns the result."""
    from tss_opt.models import model_id_for
    from tss_opt.training import TrainingInterrupted, build_training_text, domain_text, train_eagle

    label, domains = training_domains(cfg, settings)
    # Collect the text before loading the model: a domain without training text fails fast.
    texts = [domain_text(d, settings.sources, settings.extra_prompts) for d in domains]
    rt = runtime or assemble(cfg)
    model_name = rt.loaded.config.name
    base = Path(settings.out_dir) / model_name
    # drafter.checkpoint (or its older name path), when given, names the output directory.
    given = [v for v in (drafter.get("checkpoint"), drafter.get("path")) if v and v != "???"]
    out = Path(str(given[0])) if given else base / label
    t0 = time.perf_counter()
    text = build_training_text(
        rt.target, rt.loaded.tokenizer, texts, settings, rt.eos_token_ids,
        cache_dir=base / ".cache", model_key=model_id_for(model_settings(cfg)),
    )
    features = text.features
    prep_s = time.perf_counter() - t0
    print(f"training text: {text.describe()}; {features.num_pairs} pairs; prepared in {prep_s:.1f} s")
    probes = _probe_prompts(domains, rt.loaded.tokenizer, settings.probe_prompts)
    metadata = {
        "model": model_name,
        "model_id": rt.loaded.model_id,
        "domains": [d.name for d in domains],
        "label": label,
        "data": text.counts,
        "pairs": features.num_pairs,
        "drafter": {k: drafter.get(k) for k in ("total_tokens", "depth", "top_k")},
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    try:
        res = train_eagle(
            rt.target, features, settings, out, probe_prompts=probes, drafter_settings=drafter,
            eos_token_ids=rt.eos_token_ids, metadata=metadata,
        )
    except TrainingInterrupted as e:
        print(
            f"interrupted at step {e.steps}; the checkpoint {e.checkpoint} holds the head as of then "
            "(loadable); add train.resume=true to the same command to continue from it",
            file=sys.stderr,
        )
        sys.exit(EXIT_INTERRUPTED)
    print(format_summary(res, label, model_name, len(probes), settings))
    return res


def train_t2d_command(cfg: DictConfig, settings: TrainSettings, drafter: dict[str, Any], runtime: Assembly | None = None) -> Any:
    """T2D: search the kept layers, distill the copy, save it; print its report.

    The training text is the same as the EAGLE head's (calibration prompts and extra
    ``train_data`` records, never validation or held-out prompts); T2D adds the target's
    greedy continuations itself. The validation prompts measure agreement on text it never
    trained on. Knobs: ``drafter.train.*`` (``conf/drafter/t2d.yaml``).
    """
    from tss_opt.config.t2d import T2DSettings
    from tss_opt.evaluation.domains import format_prompt
    from tss_opt.training import domain_text
    from tss_opt.training.t2d import train_t2d

    t2d = T2DSettings.from_mapping(drafter.get("train") or {})
    label, domains = training_domains(cfg, settings)
    texts = [(d, domain_text(d, settings.sources, settings.extra_prompts)) for d in domains]
    rt = runtime or assemble(cfg)
    tok = rt.loaded.tokenizer
    train = [format_prompt(tok, ex, d.config.system_prompt).tolist() for d, dt in texts for ex in dt.examples]
    held = [format_prompt(tok, ex, d.config.system_prompt).tolist() for d in domains for ex in d.split("validation")]
    given = drafter.get("path")
    out = Path(str(given)) if given and given != "???" else Path(settings.out_dir) / rt.loaded.config.name / label / "t2d"
    probes = [p.tolist() for p in _probe_prompts(domains, tok, settings.probe_prompts)]
    report = train_t2d(rt.loaded, train, t2d, out, progress=settings.progress, probe_prompts=probes,
                       eval_texts=held or None)
    ev = "-" if report.eval_agreement_after is None else f"{report.eval_agreement_before:.3f} -> {report.eval_agreement_after:.3f}"
    print(
        f"T2D drafter for {rt.loaded.config.name} on {label}:\n"
        f"  kept layers        {report.keep_layers} ({len(report.keep_layers)} of {report.num_layers})\n"
        f"  search             {len(report.candidates)} candidates in {report.search_s:.1f} s\n"
        f"  latency            {report.drafter_latency_ms:.1f} ms vs target {report.target_latency_ms:.1f} ms "
        f"({report.latency_ratio:.2f})\n"
        f"  agreement (train)  {report.agreement_before:.3f} -> {report.agreement_after:.3f} (undistilled -> distilled)\n"
        f"  agreement (valid.) {ev}\n"
        f"  distillation       {report.steps} steps in {report.distill_s:.1f} s, KL {report.kl_before:.3f} -> {report.kl_after:.3f}\n"
        f"  wall time          {report.total_s:.1f} s\n"
        f"use it with: drafter=t2d drafter.path={out}"
    )
    return report


def format_summary(res: Any, label: str, model: str, n_probe: int, settings: TrainSettings) -> str:
    def a(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    start = "resumed head" if settings.resume and res.total_steps != res.steps else "random head"
    rows = [
        ("steps", f"{res.steps}" + (f" ({res.total_steps} in all)" if res.total_steps != res.steps else "")),
        ("wall time", f"{res.seconds:.1f} s ({res.seconds / max(res.steps, 1):.2f} s/step, probes included)"),
        ("training pairs/s", f"{res.pairs_per_s:.0f}"),
        ("loss (fixed rows)", f"{res.initial.loss:.4f} -> {res.final.loss:.4f}"),
        ("token accuracy", f"{res.initial.accuracy:.3f} -> {res.final.accuracy:.3f}"),
        (
            "probe accepted length",
            f"{start} {a(res.probe_before)} -> trained {a(res.probe_after)} "
            f"({n_probe} calibration prompts x {settings.probe_tokens} tokens)",
        ),
        ("checkpoint", f"{res.checkpoint}"),
    ]
    w = max(len(k) for k, _ in rows)
    lines = [f"EAGLE head for {model} on {label}:"] + [f"  {k:<{w}}  {v}" for k, v in rows]
    lines.append(f"use it with: drafter=eagle drafter.checkpoint={res.checkpoint}")
    return "\n".join(lines)


main = hydra_entry(train_drafter)

if __name__ == "__main__":
    main()
