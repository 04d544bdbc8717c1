"""Where the shipped configuration lives (source checkout or installed package)."""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parents[1]


def config_dir() -> Path:
    """``conf/`` of the source checkout, or ``tss_opt/conf`` when installed as package data."""
    for cand in (_PKG / "conf", _PKG.parent / "conf"):
        if (cand / "config.yaml").is_file():
            return cand
    raise FileNotFoundError(
        f"tss_opt's configuration folder was not found next to {_PKG}; reinstall with "
        "`pip install -e .` from a source checkout"
    )
