"""The per-domain skip-set mapping: a small YAML file the runtime reads (``docs/mapping.md``).

- :func:`export_mapping` writes a finished study's S* into the file (other domains kept);
- :func:`load_mapping` reads and validates it into a :class:`DomainMapping`;
- :func:`write_entry` adds one :class:`MappingEntry` (locked read-modify-write, atomic).
"""

from __future__ import annotations

from tss_opt.mapping.export import entry_from_result, export_mapping
from tss_opt.mapping.format import (
    DomainMapping,
    MappingEntry,
    MappingError,
    OperatingPoint,
    mapping_from_data,
)
from tss_opt.mapping.io import DEFAULT_MAPPING_PATH, load_mapping, write_entry

__all__ = [
    "DEFAULT_MAPPING_PATH",
    "DomainMapping",
    "MappingEntry",
    "MappingError",
    "OperatingPoint",
    "entry_from_result",
    "export_mapping",
    "load_mapping",
    "mapping_from_data",
    "write_entry",
]
