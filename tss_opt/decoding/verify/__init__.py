"""Verification: which drafted tokens the target keeps.

- :mod:`~tss_opt.decoding.verify.accept`: the exact rules (greedy, coupled sampling,
  speculative sampling); the default and lossless.
- :mod:`~tss_opt.decoding.verify.relaxed`: the :class:`Verifier` the engine asks, with the
  lossy DIVERSED and CoSpec modes (never default, reported as such).
- :mod:`~tss_opt.decoding.verify.blend_weight` and :mod:`~tss_opt.decoding.verify.arbitration`:
  the per-token policies those two modes consult. Training them lives in
  :mod:`tss_opt.training.relaxed`.
"""
