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
import json
import random
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tss_opt.config.domain import DomainConfig
from tss_opt.errors import TSSError

from .metrics import Metric, UnknownMetricError, get_metric

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

__all__ = [
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

BUILTIN_PREFIX = "builtin:"
HF_PREFIX = "hf:"
SPLITS = ("calibration", "validation", "heldout")


class DomainError(TSSError):
    """A domain config or its data is unusable; the message names the value and the fix."""


@dataclass(frozen=True)
class Example:
    """One prompt of a domain.

    Attributes:
        id: The record's id (unique within the domain).
        prompt: The formatted user message (``prompt_template`` applied to the record).
        references: Acceptable reference outputs (may be empty for reference-free metrics).
        fields: The record as read from the data, all fields included; treat as read-only.
    """

    id: str
    prompt: str
    references: tuple[str, ...]
    fields: dict[str, Any] = field(default_factory=dict, hash=False, repr=False)


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


def _to_config(cfg: DomainConfig | Mapping[str, Any]) -> DomainConfig:
    """Validates a mapping (dict, OmegaConf DictConfig) or DomainConfig against the schema."""
    try:
        source = OmegaConf.structured(cfg) if isinstance(cfg, DomainConfig) else cfg
        merged = OmegaConf.merge(OmegaConf.structured(DomainConfig), source)
        config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        keys = ", ".join(DomainConfig.__dataclass_fields__)
        raise DomainError(f"Invalid domain config: {e}\nExpected keys: {keys}.") from e
    assert isinstance(config, DomainConfig)  # to_object of a DomainConfig schema
    return config


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
    _template_fields(config)
    _reference_regex(config)
    return metrics


def _reference_regex(config: DomainConfig) -> re.Pattern[str] | None:
    """The compiled ``reference_pattern`` (``None`` when unset)."""
    if not config.reference_field.strip():
        raise DomainError(
            f"Domain {config.name!r}: reference_field is empty; name the record field holding "
            "the answers, e.g. reference_field: references."
        )
    if config.reference_pattern is None:
        return None
    try:
        return re.compile(config.reference_pattern)
    except re.error as e:
        raise DomainError(
            f"Domain {config.name!r}: reference_pattern {config.reference_pattern!r} is not a "
            f"valid regular expression ({e}); group 1 must capture the answer, e.g. '####\\s*(.+)'."
        ) from e


def _template_fields(config: DomainConfig) -> list[str]:
    """The field names ``prompt_template`` uses; rejects malformed or positional templates."""
    try:
        parsed = list(string.Formatter().parse(config.prompt_template))
    except ValueError as e:
        raise DomainError(
            f"Domain {config.name!r}: prompt_template {config.prompt_template!r} is not a valid "
            f"str.format template ({e}); write literal braces as '{{{{' and '}}}}'."
        ) from e
    names = []
    for _, name, _, _ in parsed:
        if name is None:
            continue
        root = name.split(".")[0].split("[")[0]
        if not root or root.isdigit():
            raise DomainError(
                f"Domain {config.name!r}: prompt_template {config.prompt_template!r} uses a "
                "positional field; name record fields instead, e.g. '{prompt}'."
            )
        names.append(root)
    return names


def _read_jsonl(text: str, label: str) -> list[tuple[int, dict[str, Any]]]:
    """Parses JSONL text into (line number, record) pairs; blank lines are skipped."""
    records = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DomainError(
                f"{label}:{lineno}: malformed JSON ({e.msg}); fix or remove the line."
            ) from e
        if not isinstance(record, dict):
            raise DomainError(
                f"{label}:{lineno}: expected a JSON object per line, got {type(record).__name__}."
            )
        records.append((lineno, record))
    return records


def _builtin_dir() -> Path:
    return Path(str(resources.files("tss_opt") / "data"))


def _read_hf(spec: str) -> tuple[str, list[tuple[int, dict[str, Any]]]]:
    parts = spec[len(HF_PREFIX) :].split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise DomainError(
            f"Bad data {spec!r}; expected 'hf:<dataset>:<split>' or 'hf:<dataset>:<config>:<split>'."
        )
    dataset, config, split = (parts[0], None, parts[1]) if len(parts) == 2 else parts
    try:
        import datasets  # optional: only users with network access need it
    except ImportError as e:
        raise DomainError(
            f"data {spec!r} needs the Hugging Face 'datasets' package: pip install datasets "
            "(or export the records to a JSONL file and point 'data' at it)."
        ) from e
    try:
        rows = datasets.load_dataset(dataset, config, split=split)
    except Exception as e:  # network, missing dataset, bad split: all user-facing
        raise DomainError(f"Could not load {spec!r} with datasets.load_dataset: {e}") from e
    return spec, [(i + 1, dict(row)) for i, row in enumerate(rows)]


def _read_records(data: str, domain: str) -> tuple[str, list[tuple[int, dict[str, Any]]]]:
    """Reads a domain's records; returns a label for messages and (line, record) pairs."""
    if data.startswith(HF_PREFIX):
        label, records = _read_hf(data)
    else:
        if data.startswith(BUILTIN_PREFIX):
            name = data[len(BUILTIN_PREFIX) :]
            path = _builtin_dir() / name
            if not path.is_file():
                shipped = ", ".join(sorted(p.name for p in _builtin_dir().glob("*.jsonl")))
                raise DomainError(
                    f"Domain {domain!r}: no built-in data file {name!r}. Shipped: {shipped}."
                )
        else:
            path = Path(data).expanduser()
            if not path.is_file():
                raise DomainError(
                    f"Domain {domain!r}: data file {str(path)!r} not found (resolved to "
                    f"{path.resolve()}); relative paths are taken from the current directory "
                    f"{Path.cwd()}, so use an absolute path or 'builtin:<file>'."
                )
        label = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DomainError(f"{label}: cannot read the data file ({e}).") from e
        records = _read_jsonl(text, label)
    if not records:
        raise DomainError(
            f"{label}: no records (the data is empty); expected one JSON object per line."
        )
    return label, records


def _references(value: Any, where: str, config: DomainConfig | None = None) -> tuple[str, ...]:
    field_name = config.reference_field if config is not None else "references"
    if value is None:
        return ()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)  # a bare number ("reference": 42) is what numeric answers look like
    if isinstance(value, str):
        refs: tuple[str, ...] = (value,)
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        refs = tuple(value)
    else:
        raise DomainError(
            f"{where}: {field_name!r} must be a string or a list of strings, got {value!r}."
        )
    pattern = _reference_regex(config) if config is not None else None
    if pattern is None:
        return refs
    out = []
    for ref in refs:
        m = pattern.search(ref)
        if m is None:
            raise DomainError(
                f"{where}: reference {ref!r} does not match reference_pattern "
                f"{pattern.pattern!r}; fix the record or the pattern."
            )
        out.append((m.group(1) if pattern.groups else m.group(0)).strip())
    return tuple(out)


def _make_example(record: dict[str, Any], where: str, config: DomainConfig, line: int) -> Example:
    raw_id = record.get("id", f"{config.name}-{line}")
    if not isinstance(raw_id, (str, int)):
        raise DomainError(f"{where}: 'id' must be a string or integer, got {raw_id!r}.")
    try:
        prompt = config.prompt_template.format(**record)
    except KeyError as e:
        raise DomainError(
            f"{where}: record {str(raw_id)!r} has no field {e.args[0]!r} used by prompt_template "
            f"{config.prompt_template!r}; its fields are {sorted(record)}. Add the field or "
            "change prompt_template."
        ) from e
    except (IndexError, AttributeError, TypeError, ValueError) as e:
        raise DomainError(
            f"{where}: prompt_template {config.prompt_template!r} cannot format record "
            f"{str(raw_id)!r}: {e}."
        ) from e
    if not prompt.strip():
        raise DomainError(f"{where}: record {str(raw_id)!r} gives an empty prompt.")
    return Example(
        id=str(raw_id),
        prompt=prompt,
        references=_references(record.get(config.reference_field), where, config),
        fields=record,
    )


def load_domain(cfg: DomainConfig | Mapping[str, Any]) -> Domain:
    """Validates a domain config, reads its data and builds the example pool.

    Args:
        cfg: A :class:`DomainConfig`, a plain mapping with its keys, or an OmegaConf
            ``DictConfig`` (e.g. Hydra's ``cfg.domain``). Missing optional keys take the
            protocol defaults.

    Returns:
        The domain, its pool truncated to ``pool_size`` records in data order.

    Raises:
        DomainError: For an invalid config, an unknown metric, unreadable, empty or malformed
            data (naming the file and line), a record the template cannot format, a record
            without references for a metric that needs them, or split sizes that exceed the
            pool.
    """
    config = _to_config(cfg)
    metrics = _check_config(config)
    label, records = _read_records(config.data, config.name)
    needs_refs = [m.name for m in metrics if m.needs_references]
    pool: list[Example] = []
    for where, example in _unique_examples(records[: config.pool_size], label, config, "a domain"):
        if needs_refs and not example.references:
            raise DomainError(
                f"{where}: record {example.id!r} has no references, but metric "
                f"{', '.join(map(repr, needs_refs))} needs them; add the field "
                f"{config.reference_field!r} (reference_field), or choose the reference-free "
                "metric non_repetition."
            )
        pool.append(example)
    return Domain(config, pool, source=label)


def read_examples(data: str, config: DomainConfig | Mapping[str, Any]) -> list[Example]:
    """Reads records from ``data`` (any ``data`` source) as examples of the domain ``config``:
    formatted with its ``prompt_template``, references read when present (never required).

    For text beside the pool, such as ``train_data`` (drafter training); the pool itself is
    :func:`load_domain`'s.

    Raises:
        DomainError: unreadable, empty or malformed data (naming the file and line), a record
            the template cannot format, duplicate ids.
    """
    config = _to_config(config)
    label, records = _read_records(data, config.name)
    return [example for _, example in _unique_examples(records, label, config, "a file")]


def _unique_examples(
    records: Sequence[tuple[int, Any]], label: str, config: DomainConfig, within: str
) -> list[tuple[str, Example]]:
    """``(where, example)`` per record (``where`` = ``label:line``), refusing a repeated id.

    Raises:
        DomainError: a malformed record, or an id seen before (``within`` names the scope).
    """
    out: list[tuple[str, Example]] = []
    first_line: dict[str, int] = {}
    for line, record in records:
        where = f"{label}:{line}"
        example = _make_example(record, where, config, line)
        if example.id in first_line:
            raise DomainError(
                f"{where}: duplicate id {example.id!r} (first at line {first_line[example.id]}); "
                f"ids must be unique within {within}."
            )
        first_line[example.id] = line
        out.append((where, example))
    return out


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
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        # transformers 5 returns a BatchEncoding (a Mapping); older versions a list of ids.
        ids = out["input_ids"] if isinstance(out, Mapping) else out
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
                loaded = OmegaConf.load(path)
            except Exception as e:  # YAML syntax errors come from several libraries
                raise DomainError(f"{path}: invalid YAML ({e}).") from e
            if not isinstance(loaded, Mapping):
                raise DomainError(f"{path}: expected a mapping of domain keys, got a list.")
            try:
                return _to_config(loaded)
            except DomainError as e:
                raise DomainError(f"{path}: {e}") from e
    known = available_domains(config_dirs)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise DomainError(
        f"Unknown domain {name!r}.{hint} Available: {', '.join(known) or '(none)'} "
        f"(searched {', '.join(str(Path(d) / 'domain') for d in config_dirs)})."
    )
