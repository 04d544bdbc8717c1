"""The project's own log records, for tests that count log lines."""

from __future__ import annotations

import logging

import pytest

# The project's loggers all live below this name (``logging.getLogger(__name__)``).
PROJECT_LOGGER = "tss_opt"


def project_messages(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    """The messages the project's own loggers emitted at ``level`` or above, in order.

    A test that counts log lines counts these: what Optuna, transformers or pytest log (and
    which of their records a given pytest version hands to ``caplog``) is theirs to change.
    Under pytest 9.2, Optuna's "A new study created in RDB" record reached ``caplog`` where
    8.4 kept it out, and a test that counted every INFO record broke.
    """
    own = (r for r in caplog.records if r.name == PROJECT_LOGGER or r.name.startswith(PROJECT_LOGGER + "."))
    return [r.getMessage() for r in own if r.levelno >= level]
