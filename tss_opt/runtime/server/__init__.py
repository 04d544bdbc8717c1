"""The OpenAI-compatible HTTP server over one loaded model, many requests in one batch.

- ``settings.py``: the settings, the API key, the refusal to bind beyond loopback without one.
- ``request_models.py``: OpenAI request bodies as pydantic models (``param`` from the error's location).
- ``schemas.py``: OpenAI response bodies, the ``tss`` object.
- ``worker.py``: the scheduler: a bounded FIFO queue and one continuous batch on one thread.
- ``text.py``: output text, stop strings, stream deltas that join to the full text.
- ``reload.py``: the mapping file reloaded when it changes.
- ``security.py``: bearer-key check and body-size limit.
- ``connections.py``: deadlines for headers, bodies and idle connections; room for new ones.
- ``metrics.py``: Prometheus metrics.
- ``app.py``: the FastAPI routes and the shutdown drain; ``run.py``: start-up, SIGTERM.

See docs/serving.md.
"""

from tss_opt.runtime.server.app import ServingState, create_app
from tss_opt.runtime.server.errors import APIError
from tss_opt.runtime.server.run import (
    DrainingServer,
    make_server,
    run_server,
    uvicorn_config,
)
from tss_opt.runtime.server.settings import API_KEY_ENV, ServerSettings, is_loopback

__all__ = [
    "API_KEY_ENV",
    "APIError",
    "DrainingServer",
    "ServerSettings",
    "ServingState",
    "create_app",
    "is_loopback",
    "make_server",
    "run_server",
    "uvicorn_config",
]
