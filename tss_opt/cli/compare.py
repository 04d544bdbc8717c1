"""``python -m tss_opt.cli.compare +domain=NAME strategies=[beam,sleb,random] search.max_trials=N``

Runs each listed search strategy on one domain with one budget (each in its own study, named
as ``python -m tss_opt`` would name it with ``search.mode=<strategy>``; finished studies are
reused), evaluates every chosen skip set and the dense baseline on ``heldout_prompts``
held-out prompts (0: none), and writes ``compare_<domain>.md`` / ``.json`` (the paper's Table 2
layout) and ``compare_<domain>.png`` (best feasible cost against evaluations) into
``report_dir``. See docs/compare.md.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tss_opt.assembly import assemble, configured_evaluator, require_domain
from tss_opt.cli.common import hydra_entry
from tss_opt.config.objectives import ACCEPT_LENGTH, METRIC
from tss_opt.errors import UsageError

log = logging.getLogger("tss_opt.cli")


def with_search(cfg: DictConfig, **values: Any) -> DictConfig:
    """A copy of ``cfg`` with ``search.<key>=value`` set (the study name follows)."""
    out = copy.deepcopy(cfg)
    for k, v in values.items():
        OmegaConf.update(out, f"search.{k}", v, merge=False)
    return out


def run_study(cfg: DictConfig, evaluator: Any) -> Any:
    """Run (or reuse) the study ``cfg`` names with ``evaluator``; return its SearchResult."""
    from tss_opt.assembly import search_settings, study_identity
    from tss_opt.search import run_search

    name, metadata = study_identity(cfg)
    settings = search_settings(cfg)
    metadata["model"] = getattr(evaluator, "model_id", metadata["model"])
    log.info("study %s (%s)", name, settings.mode)
    # run_search refuses a stored study of another identity (settings or protocol) itself.
    return run_search(evaluator, settings, storage=cfg.storage, study_name=name, metadata=metadata)


class HeldoutSets:
    """Held-out A / M / tok/s of skip sets, measured together at the end, interleaved per prompt.

    ``add`` each chosen set while the studies run; ``measure`` then runs the domain's held-out
    prompts once under dense and every distinct set, rotating through them prompt by prompt
    (:func:`~tss_opt.report.heldout.measure_interleaved`), so their tokens/s share the
    machine's conditions. ``heldout_prompts=0`` measures nothing.
    """

    def __init__(self, cfg: DictConfig, runtime: Any) -> None:
        from tss_opt.assembly import max_new_tokens_for

        self.cfg, self.runtime = cfg, runtime
        self.domain = require_domain(cfg)
        n = cfg.get("heldout_prompts")
        self.prompts = self.domain.config.heldout_size if n is None else int(n)
        self.max_new_tokens = max_new_tokens_for(cfg, self.domain)
        self.sets: list[frozenset[int]] = [frozenset()]
        self.done: dict[frozenset[int], dict[str, float | None]] = {}

    def add(self, skip: list[int]) -> None:
        if frozenset(skip) not in self.sets:
            self.sets.append(frozenset(skip))

    def measure(self) -> None:
        from tss_opt.assembly import base_protocol
        from tss_opt.report.heldout import measure_interleaved

        if self.prompts <= 0:
            return
        rt = self.runtime
        log.info("held-out: %d prompts under %d skip sets (dense included), interleaved", self.prompts, len(self.sets))
        results = measure_interleaved(
            rt.target, rt.loaded.tokenizer, rt.new_drafter, self.domain,
            [(str(sorted(s)), s, None) for s in self.sets],
            protocol=base_protocol(self.cfg, rt.eos_token_ids), prompts=self.prompts,
            max_new_tokens=self.max_new_tokens, warmup=True, show_progress=True,
        )
        for s, r in zip(self.sets, results, strict=True):
            self.done[s] = {ACCEPT_LENGTH: r.accept_length, METRIC: r.metric, "tokens_per_s": r.tokens_per_s}

    def __call__(self, skip: list[int]) -> dict[str, float | None]:
        return self.done.get(frozenset(skip), {})

    def fill(self, rows: list[Any]) -> None:
        """Measure every added set, then give each row its set's held-out figures."""
        self.measure()
        for row in rows:
            row.heldout = self(row.skip_set)


def log_shared(evaluator: Any) -> None:
    """Say how many requests the studies' shared measurements answered (MemoEvaluator)."""
    if hasattr(evaluator, "hits"):
        log.info("measurements shared between studies: %d of %d requests answered from memory",
                 evaluator.hits, evaluator.hits + evaluator.misses)


REPLAY_NOTE = (
    "cal tok/s: not shown, the search ran evaluator=replay, whose timing is the batched replay's, not "
    "speculative decoding's; ho tok/s are real speculative decoding, every set interleaved per prompt."
)


def hide_replay_speed(cfg: DictConfig, rows: list[Any], evaluator: Any = None) -> str:
    """With ``evaluator=replay`` (or ``auto`` running the replay), blank the rows' calibration
    tok/s and return the note saying why (empty otherwise): a replay's throughput must not
    read as a decoding speed."""
    from tss_opt.evaluation.choice import runs_replay

    if cfg.evaluator.get("kind") != "replay" and not runs_replay(evaluator):
        return ""
    for row in rows:
        row.calibration["tokens_per_s"] = None
    return REPLAY_NOTE


def calibration_evaluator(cfg: DictConfig, runtime: Any) -> Any:
    """The search's evaluator (``evaluator.kind``, or your ``evaluator._target_``), sharing one loaded model.

    A greedy evaluator is wrapped in :class:`~tss_opt.search.memo.MemoEvaluator`: the studies
    of one ``compare`` / ``sweep`` run share their measurements (most start with the same
    single-layer level), each study still counting every trial it records.
    """
    from tss_opt.search.memo import MemoEvaluator, memoizable

    evaluator = configured_evaluator(cfg, runtime=runtime)
    if memoizable(evaluator):
        return MemoEvaluator(evaluator)
    log.info("evaluator is not greedy: every study measures its own trials")
    return evaluator


def compare(cfg: DictConfig) -> list[Any]:
    from tss_opt.report.compare import (
        ComparisonRow,
        comparison_markdown,
        plot_best_cost,
        row_from_result,
        write_rows,
    )
    from tss_opt.search import MODES

    strategies = [str(s) for s in (cfg.get("strategies") or [])]
    if not strategies:
        raise UsageError(f"no strategies listed; add strategies=[beam,sleb,random] (options: {', '.join(MODES)})")
    unknown = [s for s in strategies if s not in MODES]
    if unknown:
        raise UsageError(f"unknown strateg{'y' if len(unknown) == 1 else 'ies'} {', '.join(map(repr, unknown))}; expected one of: {', '.join(MODES)}")
    domain = require_domain(cfg)
    # Check every strategy's settings (budget, seed) before loading a model.
    from tss_opt.assembly import search_settings
    from tss_opt.search.strategies import check_budget

    num_layers = int(cfg.model.num_layers)
    for s in strategies:
        check_budget(search_settings(with_search(cfg, mode=s)), num_layers)
    rt = assemble(cfg, "search")  # measures a study's figures: dtype=auto keeps its precision
    evaluator = calibration_evaluator(cfg, rt)
    heldout = HeldoutSets(cfg, rt)
    rows: list[ComparisonRow] = []
    dense: ComparisonRow | None = None
    for s in strategies:
        result = run_study(with_search(cfg, mode=s), evaluator)
        row = row_from_result(s, result)
        heldout.add(row.skip_set)
        rows.append(row)
        if dense is None:
            b = result.baseline
            dense = ComparisonRow(
                label="dense", study_name="", skip_set=[], sparsity=0.0,
                calibration={k: (float(b[k]) if isinstance(b.get(k), (int, float)) else None) for k in (ACCEPT_LENGTH, METRIC, "tokens_per_s")},
                heldout={}, curve=[], evaluations=0,
            )
            dense_cost = float(b["cost"]) if "cost" in b else None
    heldout.fill(rows + ([dense] if dense is not None else []))
    log_shared(evaluator)
    metric = evaluator.metric_name if hasattr(evaluator, "metric_name") else "metric"
    note = hide_replay_speed(cfg, rows + ([dense] if dense is not None else []), evaluator)
    md = comparison_markdown(rows, metric_name=metric, domain=domain.name, dense=dense)
    if note:
        md += "\n\n" + note
    budget = cfg.search.max_trials
    meta = {
        "domain": domain.name, "model": rt.loaded.model_id, "drafter": rt.drafter_cfg.get("name"),
        "max_trials": budget, "heldout_prompts": heldout.prompts, "metric": metric,
        "dense": None if dense is None else dense.__dict__,
    }
    paths = write_rows(rows, md, cfg.report_dir, f"compare_{domain.name}", meta)
    paths["plot"] = plot_best_cost(
        rows, f"{cfg.report_dir}/compare_{domain.name}.png",
        title=f"{domain.name}: best feasible cost vs evaluations (max_trials={budget})", dense_cost=dense_cost,
    )
    print(md)
    print()
    for path in paths.values():
        print(f"wrote {path}")
    return rows


main = hydra_entry(compare)

if __name__ == "__main__":
    main()
