"""Compute kernels of our own, built from source at first use where the CPU has what they need.

- ``rows``: bfloat16 products of a decoding step's few rows on CPUs with AVX-512 BF16
  (``rows_bf16.c``; decoding/linear.py chooses it over oneDNN on one thread).
"""
