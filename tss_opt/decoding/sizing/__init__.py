"""Drafts sized to the hardware and the context (Sequoia's idea, Chen et al. 2024), one job per
module:

- :mod:`~tss_opt.decoding.sizing.latency`: verification latency against tree size, measured
  once per (machine, model, dtype, device, cached length) and cached as JSON
  (``storage/tree_sizing/latency-<key>[-ctx<n>].json``), and drafters' measured draft costs.
- :mod:`~tss_opt.decoding.sizing.measured`: what every measured table shares (its provenance,
  the busy-host rule, its file name, load-or-measure-once); the batch engine's
  ``BatchLatency`` is one too.
- :mod:`~tss_opt.decoding.sizing.choice`: the pure choice (:func:`choose_tree`) from a latency
  table and an :class:`AcceptanceProfile`; the shared priors.
- :mod:`~tss_opt.decoding.sizing.profiles`: measured acceptance profiles cached as JSON
  (``profile-<drafter>.json``); else the drafter class's ``sizing_prior``.
- :mod:`~tss_opt.decoding.sizing.context`: one choice per cached-length bucket
  (:class:`ContextSized`), what every sized drafter uses.
- :mod:`~tss_opt.decoding.sizing.online`: a copy chain's length chosen at every step from the
  acceptance its own request has shown so far (:class:`OnlineChain`, ``adapt: true``).
- :mod:`~tss_opt.decoding.sizing.measure`: acceptance and draft costs measured through the
  engine (import it directly: it imports the engine).

Settings (conf/drafter/*.yaml): ``template: auto`` (Token Recycling, SAMD's fallback),
``total_tokens: auto`` (EAGLE), ``num_tokens: auto`` (SAMD's match chain, prompt lookup,
draft_model, self, t2d). The cache folder is :func:`sizing_dir` (``storage/tree_sizing`` or
``$TSS_TREE_SIZING_DIR``); the choice is a pure function of the files there, so every build on
a machine chooses the same trees.
"""

from tss_opt.decoding.sizing.choice import (
    COPY_CHAIN_PRIOR,
    MODEL_CHAIN_PRIOR,
    RANK_PRIOR,
    AcceptanceProfile,
    Prior,
    TreeChoice,
    best_tree,
    choose_tree,
    sibling_ranks,
)
from tss_opt.decoding.sizing.context import (
    CONTEXT_BUCKETS,
    ContextSized,
    fitting_buckets,
    sized_chain,
    sized_tree,
)
from tss_opt.decoding.sizing.latency import (
    DEFAULT_DIR,
    DEFAULT_SIZES,
    ENV_DIR,
    LatencyTable,
    TreeSizingError,
    hardware_key,
    load_or_measure_draft_cost,
    load_or_measure_latency,
    measure_latency,
    sizing_dir,
)
from tss_opt.decoding.sizing.online import OnlineChain
from tss_opt.decoding.sizing.profiles import load_profile, profile_path, save_profile

AUTO = "auto"
"""The size setting (``template``, ``num_tokens``, ``total_tokens``) that asks for a sized draft."""

__all__ = [
    "AUTO", "CONTEXT_BUCKETS", "COPY_CHAIN_PRIOR", "DEFAULT_DIR", "DEFAULT_SIZES", "ENV_DIR", "MODEL_CHAIN_PRIOR", "RANK_PRIOR",
    "AcceptanceProfile", "ContextSized", "LatencyTable", "OnlineChain", "Prior", "TreeChoice", "TreeSizingError", "best_tree",
    "choose_tree", "fitting_buckets", "hardware_key", "load_or_measure_draft_cost", "load_or_measure_latency", "load_profile",
    "measure_latency", "profile_path", "save_profile", "sibling_ranks", "sized_chain", "sized_tree", "sizing_dir",
]
