"""Task domains as data: a YAML config plus a JSONL pool of prompts with references.

A domain is what a skip set is searched for. Its config (``conf/domain/<name>.yaml``, Hydra
group ``domain``) names the data, the prompt template and the metric; no code is needed to add
one. The protocol (80 prompts shuffled with seed 42: 16 for calibration, i.e. the search, 16 for
validation, which checks the search's choice, and 48 held out for reports only) is the default of
:class:`DomainConfig` and is carried out by :meth:`Domain.split`.

Data sources (``DomainConfig.data``):

- ``builtin:<file>``: a file shipped in ``tss_opt/data`` (package data);
- a filesystem path, absolute or relative to the current directory (``~`` expanded);
- ``hf:<dataset>[:<config>]:<split>``: a Hugging Face dataset (needs ``pip install datasets``
  and network access); each row is one record.

Each record is a JSON object ``{"id": str, "prompt": str, "references": [str, ...], ...}``;
the user message is ``prompt_template.format(**record)``, so templates may use any field. The
references are read from ``reference_field`` (a string or a list of strings; default
``references``); an optional ``reference_pattern`` regex cuts the answer out of each reference
(group 1, or the whole match without a group), as lm-evaluation-harness's regex filters do, e.g.
``"####\\s*(.+)"`` for GSM8K's ``"... #### 42"``.
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tss_opt.config.domain import DomainConfig, load_domain_yaml
from tss_opt.evaluation.domain_data import (
    BUILTIN_PREFIX,
    HF_PREFIX,
    DomainError,
    Example,
    read_examples,
    read_records,
    reference_regex,
    template_fields,
    to_domain_config,
    unique_examples,
)
from tss_opt.evaluation.metrics import Metric, UnknownMetricError, get_metric

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "BUILTIN_PREFIX",
    "HF_PREFIX",
    "Domain",
    "DomainConfig",
    "DomainError",
    "Example",
    "available_domains",
    "format_prompt",
    "load_domain",
    "read_domain_config",
    "read_examples",
]

SPLITS = ("calibration", "validation", "heldout")


class Domain:
    """A loaded domain: its config, its prompt pool and the calibration/validation/held-out splits.

    Attributes:
        config: The validated config.
        pool: All examples in data order, truncated to ``config.pool_size``.
        source: A human-readable description of where the data came from.
    """

    def __init__(self, config: DomainConfig, pool: list[Example], source: str = "") -> None:
        calib, val, held = config.calibration_size, config.validation_size, config.heldout_size
        need = calib + val + held
        if need > len(pool):
            raise DomainError(
                f"Domain {config.name!r}: calibration_size + validation_size + heldout_size = "
                f"{calib} + {val} + {held} = {need} exceeds the pool of "
                f"{len(pool)} records (pool_size={config.pool_size}, data {source or config.data}); "
                "lower the split sizes so that they sum to at most the pool, or add records."
            )
        self.config = config
        self.pool = pool
        self.source = source or config.data
        shuffled = list(pool)
        random.Random(config.shuffle_seed).shuffle(shuffled)
        # Calibration first (so it stays the same prompts whatever the other sizes are),
        # then validation, then held out: three disjoint slices of one shuffle.
        self._splits = {
            "calibration": shuffled[:calib],
            "validation": shuffled[calib : calib + val],
            "heldout": shuffled[calib + val : need],
        }

    def __repr__(self) -> str:
        return f"Domain({self.name!r}, pool={len(self.pool)}, metric={self.config.metric!r})"

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def metric(self) -> Metric:
        """The search objective's metric (its direction sets the study direction)."""
        return get_metric(self.config.metric)

    @property
    def extra_metrics(self) -> list[Metric]:
        return [get_metric(name) for name in self.config.extra_metrics]

    def split(self, name: Literal["calibration", "validation", "heldout"]) -> list[Example]:
        """Returns one split of the pool.

        The pool is shuffled with ``random.Random(shuffle_seed)``; the first
        ``calibration_size`` examples are the calibration split, the next ``validation_size``
        the validation split, the next ``heldout_size`` the held-out split. Deterministic and
        disjoint.

        Raises:
            DomainError: For a split name other than "calibration", "validation" or "heldout".
        """
        if name not in self._splits:
            raise DomainError(f"Unknown split {name!r}; expected one of: {', '.join(SPLITS)}.")
        return list(self._splits[name])


def _check_config(config: DomainConfig) -> list[Metric]:
    """Checks values the schema cannot; returns the metrics (objective first)."""
    if not config.name.strip():
        raise DomainError("Domain config has an empty 'name'; set name: <domain>.")
    for key in ("max_new_tokens", "pool_size", "calibration_size"):
        if getattr(config, key) < 1:
            raise DomainError(
                f"Domain {config.name!r}: {key}={getattr(config, key)}, expected >= 1."
            )
    for key in ("validation_size", "heldout_size"):
        if getattr(config, key) < 0:
            raise DomainError(
                f"Domain {config.name!r}: {key}={getattr(config, key)}, expected >= 0."
            )
    metrics = []
    for key, name in [("metric", config.metric)] + [
        ("extra_metrics", m) for m in config.extra_metrics
    ]:
        try:
            metrics.append(get_metric(name))
        except UnknownMetricError as e:
            raise DomainError(f"Domain {config.name!r}, {key}: {e}") from e
    template_fields(config)
    reference_regex(config)
    return metrics


def load_domain(cfg: DomainConfig | Mapping[str, Any]) -> Domain:
    """Validates a domain config, reads its data and builds the example pool.

    Args:
        cfg: A :class:`DomainConfig` or a mapping with its keys (Hydra's ``cfg.domain``, typed
            by the config layer). Missing optional keys take the protocol defaults.

    Returns:
        The domain, its pool truncated to ``pool_size`` records in data order.

    Raises:
        DomainError: For an invalid config, an unknown metric, unreadable, empty or malformed
            data (naming the file and line), a record the template cannot format, a record
            without references for a metric that needs them, or split sizes that exceed the
            pool.
    """
    config = to_domain_config(cfg)
    metrics = _check_config(config)
    label, records = read_records(config.data, config.name)
    needs_refs = [m.name for m in metrics if m.needs_references]
    pool: list[Example] = []
    for where, example in unique_examples(records[: config.pool_size], label, config, "a domain"):
        if needs_refs and not example.references:
            raise DomainError(
                f"{where}: record {example.id!r} has no references, but metric "
                f"{', '.join(map(repr, needs_refs))} needs them; add the field "
                f"{config.reference_field!r} (reference_field), or choose the reference-free "
                "metric non_repetition."
            )
        pool.append(example)
    return Domain(config, pool, source=label)


def format_prompt(
    tokenizer: PreTrainedTokenizerBase, example: Example, system_prompt: str | None = None
) -> torch.LongTensor:
    """Turns an example into the prompt token ids the model is fed.

    With a chat template, the (optional) system message and the example's prompt as the user
    turn go through ``tokenizer.apply_chat_template(..., add_generation_prompt=True)``, which
    adds the template's own special tokens. Without one, the plain text (system prompt, a blank
    line, then the prompt) is encoded with the tokenizer's usual special tokens (e.g. BOS).

    Args:
        tokenizer: A Hugging Face tokenizer.
        example: The example to format.
        system_prompt: Optional system message (usually ``DomainConfig.system_prompt``).

    Returns:
        ``torch.LongTensor`` of shape ``(seq,)``.
    """
    import torch  # imported here so config and metric code stays light

    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": example.prompt})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    else:
        text = f"{system_prompt}\n\n{example.prompt}" if system_prompt else example.prompt
        ids = tokenizer(text)["input_ids"]
    ids = torch.as_tensor(ids, dtype=torch.long)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]  # a batch of one conversation
    if ids.dim() != 1 or ids.numel() == 0:
        raise DomainError(
            f"Tokenizing example {example.id!r} gave ids of shape {tuple(ids.shape)}, expected (seq,)."
        )
    return ids


def available_domains(config_dirs: Sequence[Path | str]) -> list[str]:
    """Names of the domain configs (``<dir>/domain/*.yaml``) in the given config folders, sorted."""
    names = {p.stem for d in config_dirs for p in (Path(d).expanduser() / "domain").glob("*.yaml")}
    return sorted(names)


def read_domain_config(name: str, config_dirs: Sequence[Path | str]) -> DomainConfig:
    """Reads ``<dir>/domain/<name>.yaml`` from the first config folder that has it.

    For code that runs without Hydra (the runtime controller, scripts); Hydra users select a
    domain with ``+domain=<name>`` instead.

    Raises:
        DomainError: If no folder has the domain (with a "Did you mean" suggestion), or its
            YAML is invalid.
    """
    for config_dir in config_dirs:
        path = Path(config_dir).expanduser() / "domain" / f"{name}.yaml"
        if path.is_file():
            try:
                loaded = load_domain_yaml(path)
            except Exception as e:  # YAML syntax errors come from several libraries
                raise DomainError(f"{path}: invalid YAML ({e}).") from e
            if not isinstance(loaded, Mapping):
                raise DomainError(f"{path}: expected a mapping of domain keys, got a list.")
            try:
                return to_domain_config(loaded)
            except DomainError as e:
                raise DomainError(f"{path}: {e}") from e
    known = available_domains(config_dirs)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise DomainError(
        f"Unknown domain {name!r}.{hint} Available: {', '.join(known) or '(none)'} "
        f"(searched {', '.join(str(Path(d) / 'domain') for d in config_dirs)})."
    )
