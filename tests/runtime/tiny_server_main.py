"""A server process for the SIGTERM test: the tiny model (deeper than the usual one, so a long
request takes seconds), EOS never ending a request early, served by ``run_server`` as the
command serves, until a signal.

Usage: ``python tiny_server_main.py MAPPING PORT SHUTDOWN_GRACE``
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import torch
from server_support import make_state, tiny_controller

from tss_opt.decoding.target import TargetModel
from tss_opt.models import ModelConfig, load_model
from tss_opt.runtime.server import run_server

if __name__ == "__main__":
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    mapping, port, grace = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    tiny = load_model(ModelConfig(name="tiny", source="tiny", num_layers=16, seed=0))
    controller = tiny_controller(tiny, TargetModel(tiny.model, layers_path=tiny.config.layers_path), mapping)
    controller.eos_token_ids = ()
    # One row in the batch: the other requests wait in the queue when the signal comes.
    state = make_state(controller, None, port=port, max_queue=2, max_batch=1, max_tokens_cap=1900, shutdown_grace=grace)
    run_server(state, "info")
