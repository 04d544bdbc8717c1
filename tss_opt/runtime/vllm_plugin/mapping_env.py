"""The mapping every vLLM process of a TSS deployment reads: named by the environment.

vLLM spawns its engine core and workers; what they must share is passed down as environment
variables, which spawned processes inherit (the launch command and :func:`llm_env` set them):

- ``TSS_MAPPING``: the mapping file (absent: no mapping; every domain runs dense);
- ``TSS_MODEL_ID``: the served model's identity as studies record it (``models.model_id_for``);
  absent, only the layer count is checked.

The front end resolves domains with it (reloading the file when a search rewrites it: one
``stat`` per request); the model checks it once at load, so that a mapping written for another
model stops the start with the fix instead of skipping the wrong layers.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path

from tss_opt.mapping import DomainMapping, MappingError, load_mapping

__all__ = ["MAPPING_ENV", "MODEL_ID_ENV", "MappingSource", "check_mapping", "check_mapping_for_model", "llm_env"]

log = logging.getLogger(__name__)

MAPPING_ENV = "TSS_MAPPING"
MODEL_ID_ENV = "TSS_MODEL_ID"


def check_mapping(mapping: DomainMapping, num_layers: int, model_id: str | None = None) -> None:
    """Raise :class:`MappingError` unless ``mapping`` was searched on the served model.

    Args:
        mapping: The loaded mapping.
        num_layers: The served model's decoder layers.
        model_id: Its study identity (``None``: compare the layer count only).
    """
    if mapping.model is None:  # an empty mapping fits every model
        return
    if model_id is not None:
        mapping.check_model(model_id, num_layers)
    elif mapping.num_layers != num_layers:
        mapping.check_model(f"a {num_layers}-layer model", num_layers)
    lossy = [d for d in mapping.domains if (e := mapping.entry_for(d)) is not None and e.lossy]
    if lossy:
        log.warning(
            "mapping entries %s were chosen under a lossy verification rule; vLLM verifies exactly, "
            "so they run as their sparse target's exact output", lossy,
        )


def check_mapping_for_model(num_layers: int, env: Mapping[str, str]) -> None:
    """At model load: check the mapping the environment names (if any) against the model."""
    path = env.get(MAPPING_ENV)
    if not path:
        return
    check_mapping(load_mapping(path), num_layers, env.get(MODEL_ID_ENV) or None)


def llm_env(mapping_path: str | os.PathLike[str] | None, model_id: str | None = None) -> dict[str, str]:
    """The environment a vLLM process tree needs to serve ``mapping_path`` (set it before the
    engine starts: ``os.environ.update(llm_env(...))``)."""
    # The hooks are the V1 model runner's; where Triton exists (a GPU), vLLM 0.32 would pick V2.
    env: dict[str, str] = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    if mapping_path is not None:
        env[MAPPING_ENV] = str(Path(mapping_path).resolve())
    if model_id is not None:
        env[MODEL_ID_ENV] = model_id
    return env


class MappingSource:
    """The front end's mapping: read from ``TSS_MAPPING`` and reread when the file changes.

    A changed file that fails to load or is for another model is refused, and the previous
    mapping keeps serving (logged once per change), as in the native server.
    """

    def __init__(self, num_layers: int, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        path = env.get(MAPPING_ENV)
        self.path = Path(path) if path else None
        self.num_layers = num_layers
        self.model_id = env.get(MODEL_ID_ENV) or None
        self._lock = threading.Lock()
        self._signature: tuple[int, int, int] | None = None
        self._mapping: DomainMapping | None = None
        if self.path is not None:
            self._mapping = self._load()
            self._signature = self._stat()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)  # type: ignore[arg-type]
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _load(self) -> DomainMapping:
        mapping = load_mapping(self.path)  # type: ignore[arg-type]
        check_mapping(mapping, self.num_layers, self.model_id)
        return mapping

    def get(self) -> DomainMapping | None:
        """The mapping to resolve the next request with."""
        if self.path is None:
            return None
        sig = self._stat()
        if sig == self._signature or sig is None:
            return self._mapping
        with self._lock:
            if sig != self._signature:
                self._signature = sig
                try:
                    self._mapping = self._load()
                    log.info("mapping %s reloaded: %s", self.path, ", ".join(self._mapping.domains) or "no domains")
                except MappingError as e:
                    log.warning("mapping %s changed but was refused; still serving the previous one: %s", self.path, e)
        return self._mapping
