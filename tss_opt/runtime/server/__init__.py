"""The OpenAI-compatible HTTP server over one loaded model (issues 20, 25 and 31).

- ``settings.py``: the settings, the API key, the refusal to bind beyond loopback without one.
- ``schemas.py``: OpenAI requests (validated field by field) and responses, the ``tss`` object.
- ``worker.py``: the scheduler: a bounded FIFO queue and one continuous batch on one thread.
- ``text.py``: output text, stop strings, stream deltas that join to the full text.
- ``reload.py``: the mapping file reloaded when it changes.
- ``security.py``: bearer-key check and body-size limit.
- ``metrics.py``: Prometheus metrics.
- ``app.py``: the FastAPI routes; ``run.py``: start-up.

See docs/serving.md.
"""

from tss_opt.runtime.server.app import ServingState, create_app
from tss_opt.runtime.server.errors import APIError
from tss_opt.runtime.server.run import build_state, run_server, uvicorn_config
from tss_opt.runtime.server.settings import API_KEY_ENV, ServerSettings, is_loopback

__all__ = [
    "API_KEY_ENV",
    "APIError",
    "ServerSettings",
    "ServingState",
    "build_state",
    "create_app",
    "is_loopback",
    "run_server",
    "uvicorn_config",
]
