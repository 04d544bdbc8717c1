"""The trainers ``python -m tss_opt.cli.train_drafter`` runs, and which drafter each one trains.

A trainer takes a :class:`~tss_opt.training.job.TrainingJob`, writes the drafter where the job
says, prints a summary through ``job.echo`` and returns its result. It is registered here
against the builder of the drafter it trains (the builder ``conf/drafter/<name>.yaml`` names
by ``_target_``), so a drafter config with another name but the same builder trains alike.
The registry lives with the trainers, not with the drafters: decoding sits below training,
and a drafter module naming its trainer would point upwards.

- :func:`train_eagle_drafter`: an EAGLE-1 head (``drafter=eagle``), :mod:`tss_opt.training.eagle`.
- :func:`train_t2d_drafter`: T2D, the target's kept layers searched and distilled
  (``drafter=t2d``), :mod:`tss_opt.training.t2d`.

Adding a trainer: write ``train_<name>_drafter(job)`` and add it to :data:`TRAINERS` under
the drafter's builder.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tss_opt.config.drafters import DrafterSpec, available_drafters
from tss_opt.config.t2d import T2DSettings
from tss_opt.config.train import TrainSettings
from tss_opt.decoding.drafters.building import DrafterBuilder
from tss_opt.decoding.drafters.draft_model import build_t2d
from tss_opt.decoding.drafters.eagle import build_eagle
from tss_opt.decoding.drafters.registry import drafter_builder
from tss_opt.training.data import build_training_text
from tss_opt.training.domain_text import domain_text
from tss_opt.training.eagle import EagleTrainResult, train_eagle
from tss_opt.training.job import TrainingJob, probe_prompts
from tss_opt.training.t2d import T2DReport, train_t2d

__all__ = [
    "TRAINERS",
    "Trainer",
    "drafter_trainer",
    "eagle_summary",
    "t2d_summary",
    "train_eagle_drafter",
    "train_t2d_drafter",
    "trainable_drafters",
]

Trainer = Callable[[TrainingJob], Any]


def train_eagle_drafter(job: TrainingJob) -> EagleTrainResult:
    """Prepare the training text (the target's greedy continuations and features), train the
    head, print a summary; the checkpoint goes to ``drafter.checkpoint`` (or its older name
    ``path``) when given, else ``<train.out_dir>/<model>/<label>/``.

    Raises:
        TrainingInterrupted: Ctrl-C; the head as of then was saved (loadable).
    """
    settings, drafter = job.settings, job.drafter
    # Collect the text before loading the model: a domain without training text fails fast.
    texts = [domain_text(d, settings.sources, settings.extra_prompts) for d in job.domains]
    rt = job.load()
    model_name = rt.loaded.config.name
    base = Path(settings.out_dir) / model_name
    out = job.given_path("checkpoint", "path") or base / job.label
    t0 = time.perf_counter()
    text = build_training_text(
        rt.target, rt.loaded.tokenizer, texts, settings, rt.eos_token_ids,
        cache_dir=base / ".cache", model_key=rt.loaded.model_id,
    )  # fmt: skip
    features = text.features
    job.echo(
        f"training text: {text.describe()}; {features.num_pairs} pairs; "
        f"prepared in {time.perf_counter() - t0:.1f} s"
    )
    probes = probe_prompts(job.domains, rt.loaded.tokenizer, settings.probe_prompts)
    metadata = {
        "model": model_name,
        "model_id": rt.loaded.model_id,
        "domains": [d.name for d in job.domains],
        "label": job.label,
        "data": text.counts,
        "pairs": features.num_pairs,
        "drafter": {k: drafter.get(k) for k in ("total_tokens", "depth", "top_k")},
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    res = train_eagle(
        rt.target, features, settings, out, probe_prompts=probes, drafter_settings=dict(drafter),
        eos_token_ids=rt.eos_token_ids, metadata=metadata,
    )  # fmt: skip
    job.echo(eagle_summary(res, job.label, model_name, len(probes), settings))
    return res


def train_t2d_drafter(job: TrainingJob) -> T2DReport:
    """T2D: search the kept layers, distill the copy, save it, print its report; it goes to
    ``drafter.path`` when given, else ``<train.out_dir>/<model>/<label>/t2d``.

    The training text is the same as the EAGLE head's (calibration prompts and extra
    ``train_data`` records, never validation or held-out prompts); T2D adds the target's
    greedy continuations itself. The validation prompts measure agreement on text it never
    trained on. Knobs: ``drafter.train.*`` (``conf/drafter/t2d.yaml``).
    """
    from tss_opt.evaluation.domains import format_prompt

    settings = job.settings
    t2d = T2DSettings.from_mapping(job.drafter.get("train") or {})
    texts = [(d, domain_text(d, settings.sources, settings.extra_prompts)) for d in job.domains]
    rt = job.load()
    tok = rt.loaded.tokenizer
    train = [format_prompt(tok, ex, d.config.system_prompt).tolist() for d, dt in texts for ex in dt.examples]
    held = [
        format_prompt(tok, ex, d.config.system_prompt).tolist() for d in job.domains for ex in d.split("validation")
    ]
    out = job.given_path("path") or Path(settings.out_dir) / rt.loaded.config.name / job.label / "t2d"
    probes = [p.tolist() for p in probe_prompts(job.domains, tok, settings.probe_prompts)]
    report = train_t2d(
        rt.loaded, train, t2d, out, progress=settings.progress, probe_prompts=probes, eval_texts=held or None
    )
    job.echo(t2d_summary(report, job.label, rt.loaded.config.name, out))
    return report


def eagle_summary(res: EagleTrainResult, label: str, model: str, n_probe: int, settings: TrainSettings) -> str:
    """The lines the EAGLE trainer prints at the end: steps, time, loss, probes, checkpoint."""

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


def t2d_summary(report: T2DReport, label: str, model: str, out: Path) -> str:
    """The lines the T2D trainer prints at the end: kept layers, search, latency, agreement."""
    ev = (
        "-"
        if report.eval_agreement_after is None
        else f"{report.eval_agreement_before:.3f} -> {report.eval_agreement_after:.3f}"
    )
    return (
        f"T2D drafter for {model} on {label}:\n"
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


TRAINERS: Mapping[DrafterBuilder, Trainer] = {build_eagle: train_eagle_drafter, build_t2d: train_t2d_drafter}
"""Trainer per drafter builder."""


def drafter_trainer(cfg: DrafterSpec | Mapping[str, Any]) -> Trainer | None:
    """The trainer of the drafter ``cfg`` builds, or ``None`` for a drafter that is not trained.

    Raises:
        DrafterConfigError: unknown drafter name, or a builder that cannot be imported.
    """
    return TRAINERS.get(drafter_builder(cfg))


def trainable_drafters() -> list[str]:
    """The shipped drafters (``conf/drafter/``) that have a trainer."""
    return [name for name in available_drafters() if drafter_trainer({"name": name}) is not None]
