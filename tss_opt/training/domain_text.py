"""The examples of a domain a drafter may train on (:class:`DomainText`): its calibration prompts
and its extra records, never a validation or held-out prompt. Read by the training text
(:mod:`~tss_opt.training.data`) and the generated text (:mod:`~tss_opt.training.generated`),
so neither imports the other for it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from tss_opt.evaluation.domains import Domain, Example, read_examples
from tss_opt.training.common import TrainingDataError

__all__ = ["DomainText", "domain_text"]

log = logging.getLogger("tss_opt.training")


@dataclass
class DomainText:
    """The examples of one domain a drafter may train on.

    Attributes:
        domain: the domain.
        calibration: its calibration examples (empty when ``calibration`` is not a source).
        extra: its ``train_data`` examples, pool prompts removed.
        dropped: ``train_data`` records dropped because their prompt equals a pool prompt.
    """

    domain: Domain
    calibration: list[Example]
    extra: list[Example]
    dropped: int = 0

    @property
    def examples(self) -> list[Example]:
        return self.calibration + self.extra


def _key(text: str) -> str:
    return " ".join(text.split()).lower()


def domain_text(domain: Domain, sources: Sequence[str], extra_prompts: int | None = None) -> DomainText:
    """Collect the domain's training examples from ``sources`` (``calibration``, ``extra``).

    Args:
        domain: a loaded domain.
        sources: which parts to use.
        extra_prompts: at most this many ``train_data`` records (the first ones); ``None`` =
            all.

    Raises:
        TrainingDataError: no example at all (e.g. ``sources=[extra]`` for a domain without
            ``train_data``), naming the domain and the fix.
    """
    calibration = domain.split("calibration") if "calibration" in sources else []
    extra: list[Example] = []
    dropped = 0
    data = domain.config.train_data
    if "extra" in sources and data:
        # Every pool prompt is protected, validation and held-out ones above all; calibration
        # prompts are in the text already. Compared after collapsing whitespace and case.
        pool = {_key(e.prompt) for e in domain.pool}
        for ex in read_examples(data, domain.config):
            if _key(ex.prompt) in pool:
                dropped += 1
                continue
            extra.append(ex)
        if dropped:
            log.warning(
                "domain %s: dropped %d train_data record(s) equal to a prompt of its pool "
                "(calibration, validation or held out)", domain.name, dropped,
            )
        if extra_prompts is not None:
            extra = extra[:extra_prompts]
    out = DomainText(domain, calibration, extra, dropped)
    if not out.examples:
        why = []
        if "calibration" not in sources:
            why.append("train.sources leaves out its calibration prompts")
        if "extra" not in sources:
            why.append("train.sources leaves out its extra records")
        elif not data:
            why.append("it has no train_data (extra records) in its config")
        elif extra_prompts == 0:
            why.append("train.extra_prompts=0")
        else:
            why.append(f"every record of its train_data {data!r} equals a pool prompt")
        raise TrainingDataError(
            f"domain {domain.name!r} has no training text from train.sources={list(sources)}: "
            + "; ".join(why)
            + ". Use train.sources=[calibration,extra], or give the domain a train_data file "
            "(docs/domains.md)"
        )
    return out
