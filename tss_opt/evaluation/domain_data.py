"""A domain's data: records read from ``builtin:``, a path or ``hf:`` into :class:`Example`
values (template formatted, references cut out), with the config checked against the schema.

The data side of :mod:`tss_opt.evaluation.domains` (which re-exports what is public here):
the loaded :class:`~tss_opt.evaluation.domains.Domain`, its metrics and its splits live there.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from tss_opt.config.domain import DomainConfig, DomainConfigError, typed_domain_config
from tss_opt.errors import TSSError

__all__ = [
    "BUILTIN_PREFIX",
    "HF_PREFIX",
    "DomainError",
    "Example",
    "read_examples",
    "read_records",
    "reference_regex",
    "template_fields",
    "to_domain_config",
    "unique_examples",
]

BUILTIN_PREFIX = "builtin:"
HF_PREFIX = "hf:"

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


def to_domain_config(cfg: DomainConfig | Mapping[str, Any]) -> DomainConfig:
    """Validates a mapping of domain keys or a DomainConfig against the schema (typed by the
    config layer's :func:`~tss_opt.config.domain.typed_domain_config`).

    Raises:
        DomainError: The keys do not fit the schema (the message lists the expected keys).
    """
    try:
        return typed_domain_config(cfg)
    except DomainConfigError as e:
        keys = ", ".join(DomainConfig.__dataclass_fields__)
        raise DomainError(f"Invalid domain config: {e}\nExpected keys: {keys}.") from e


def reference_regex(config: DomainConfig) -> re.Pattern[str] | None:
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


def template_fields(config: DomainConfig) -> list[str]:
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


def read_records(data: str, domain: str) -> tuple[str, list[tuple[int, dict[str, Any]]]]:
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
    pattern = reference_regex(config) if config is not None else None
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


def read_examples(data: str, config: DomainConfig | Mapping[str, Any]) -> list[Example]:
    """Reads records from ``data`` (any ``data`` source) as examples of the domain ``config``:
    formatted with its ``prompt_template``, references read when present (never required).

    For text beside the pool, such as ``train_data`` (drafter training); the pool itself is
    :func:`load_domain`'s.

    Raises:
        DomainError: unreadable, empty or malformed data (naming the file and line), a record
            the template cannot format, duplicate ids.
    """
    config = to_domain_config(config)
    label, records = read_records(data, config.name)
    return [example for _, example in unique_examples(records, label, config, "a file")]


def unique_examples(
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
