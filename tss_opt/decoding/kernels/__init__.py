"""Compute kernels of our own, built from source at first use where the CPU has what they need.

- ``rows``: bfloat16 products of a decoding step's few rows on CPUs with AVX-512 BF16
  (``rows_bf16.c``; decoding/linear.py chooses it over oneDNN on one thread).
- ``attention``: the attention of a step's 1-4 query positions over a bfloat16 cache on the
  same CPUs (``attention_bf16.c``; decoding/attention.py's short-query path takes it).

Both are C files compiled by ``rows.py``'s build (the system's C compiler, a per-user cache)
and called through ``ctypes``.
"""
