"""The measuring loop shared by the drafter benchmarks (``taps.py``, ``drafters.py``).

Each benchmark builds a list of :class:`Method` (a drafter config, or ``None`` for plain
decoding, and a target skip set) and hands it, per domain, to :func:`measure_domain`: every
prompt is prefilled densely once and decoded by every method, in an order rotated per
prompt so machine drift hits the methods alike; each output is compared with plain decoding of
the same target. The scripts print their own tables from the collected figures.

Not a package module: the scripts ``import _measure as bench`` (``python benchmarks/taps.py`` puts
``benchmarks/`` first on ``sys.path``), after they put the repository root on ``sys.path``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from tss_opt.assembly import Assembly, assemble, compose_config
from tss_opt.config import config_dir
from tss_opt.decoding.drafters import build_drafter
from tss_opt.decoding.engine import SpeculativeEngine
from tss_opt.decoding.prefill import dense_prefill
from tss_opt.evaluation.domains import Domain, format_prompt, load_domain
from tss_opt.progress import progress_bar

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Method:
    """One benchmarked method and the figures collected over a domain's prompts.

    Attributes:
        label: the table's method cell.
        drafter_cfg: the drafter's config; ``None`` is plain decoding (the reference).
        skip: the target's skip set (scope verify); ``()`` is the dense target.
        drafter: the built drafter, kept for all prompts of a domain (warm tables, as in serving).
        tps: per prompt, new tokens over decoding time.
        steps, step_tokens: verification steps and the tokens they committed, summed.
        texts: per prompt, the decoded output.
        same: per prompt, whether the output equals plain decoding of the same target.
    """

    label: str
    drafter_cfg: dict[str, Any] | None  # None: plain decoding
    skip: tuple[int, ...]
    drafter: Any = None
    tps: list[float] = field(default_factory=list)
    steps: int = 0
    step_tokens: int = 0
    texts: list[str] = field(default_factory=list)
    same: list[bool] = field(default_factory=list)

    @property
    def accept_length(self) -> float:
        """Committed tokens per verification (bonus included); 1.0 before any step."""
        return self.step_tokens / self.steps if self.steps else 1.0

    @property
    def target_label(self) -> str:
        """The skip set as the tables show it: ``dense`` or ``[6, 21, 25]``."""
        return str(list(self.skip)) if self.skip else "dense"


def shipped_drafter(name: str, **over: Any) -> dict[str, Any]:
    """A shipped drafter config (``tss_opt/conf/drafter/<name>.yaml``) with ``over`` merged in."""
    cfg = OmegaConf.merge(OmegaConf.load(config_dir() / "drafter" / f"{name}.yaml"), over)
    out = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(out, dict)
    return out


def load_runtime(dtype: str) -> Assembly:
    """The embedded model in ``dtype``, cached under the repository's ``storage/models``."""
    return assemble(compose_config([f"dtype={dtype}", f"model.cache_dir={REPO / 'storage' / 'models'}"]))


def load_named_domain(name: str) -> Domain:
    """The shipped domain ``tss_opt/conf/domain/<name>.yaml``."""
    return load_domain(OmegaConf.load(config_dir() / "domain" / f"{name}.yaml"))


def plain_reference(methods: Sequence[Method], m: Method) -> Method:
    """Plain decoding of the same target as ``m``: what ``m``'s outputs must equal."""
    return next(r for r in methods if r.drafter_cfg is None and r.skip == m.skip)


def measure_domain(
    rt: Assembly, methods: Sequence[Method], domain: Domain, dom_name: str, examples: list[Any], max_new_tokens: int
) -> float:
    """Build every method's drafter, decode every prompt with every method and collect the figures.

    Args:
        rt: the runtime (target, tokenizer, EOS ids).
        methods: filled in place; at least one plain-decoding method per skip set.
        domain: gives the system prompt; ``dom_name`` labels the progress lines.
        examples: the domain's prompts.
        max_new_tokens: per prompt.

    Returns:
        The domain's wall time in seconds (drafter building excluded).
    """
    target, tok, eos = rt.target, rt.loaded.tokenizer, rt.eos_token_ids
    for m in methods:
        m.drafter = build_drafter(m.drafter_cfg, target, rt.loaded) if m.drafter_cfg else None
    t_dom = time.perf_counter()
    # A bar on a terminal only (stderr): the tables on stdout stay clean when redirected.
    bar = progress_bar(len(examples), dom_name, unit="prompt", leave=False)
    for i, ex in enumerate(examples):
        ids = format_prompt(tok, ex, domain.config.system_prompt)
        pre = dense_prefill(target, ids)
        # Rotate the order per prompt so no method always runs first.
        order = [*methods[i % len(methods) :], *methods[: i % len(methods)]]
        outs: dict[int, list[int]] = {}
        for m in order:
            eng = SpeculativeEngine(target, m.drafter, eos_token_ids=eos)
            res = eng.generate(ids, max_new_tokens=max_new_tokens, skip=m.skip, prefill=pre)
            s = res.stats
            m.tps.append(s.new_tokens / s.total_s)
            m.steps += s.steps
            m.step_tokens += s.step_tokens
            m.texts.append(tok.decode(res.tokens, skip_special_tokens=True))
            outs[id(m)] = res.tokens.tolist()
        for m in methods:
            m.same.append(outs[id(m)] == outs[id(plain_reference(methods, m))])
        bar.update(1)
    bar.close()
    return time.perf_counter() - t_dom


def domain_heading(
    dom_name: str, examples: list[Any], split: str, max_new_tokens: int, metric: str, seconds: float
) -> str:
    """The line above a domain's table (a blank line first)."""
    return (
        f"\n### {dom_name} ({len(examples)} {split} prompts, {max_new_tokens} new tokens, "
        f"metric {metric}; {seconds:.0f} s)"
    )


def machine_line(name: str, dtype: str, prompts: int, split: str, max_new_tokens: int) -> str:
    """The start of a benchmark's first line: threads, torch version, dtype and protocol."""
    return (
        f"# {name} benchmark: {torch.get_num_threads()} torch thread(s), torch {torch.__version__}, {dtype}; "
        f"{prompts} {split} prompts x {max_new_tokens} new tokens per domain"
    )
