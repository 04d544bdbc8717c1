"""Which floating-point types round a forward's logits coarsely enough to matter.

One value, read by the lossless rule (:mod:`tss_opt.decoding.lossless`: where a divergence from
plain decoding may be a near-tie) and by the attention switch (:mod:`tss_opt.decoding.attention`:
where a CPU's half-precision flash kernel is slow). It lives in its own module because both
of them sit below :mod:`tss_opt.decoding.target`, which imports the attention and which the
lossless check drives.
"""

from __future__ import annotations

import torch

__all__ = ["HALF_DTYPES"]

HALF_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)
"""The dtypes whose near-ties may flip between verification and plain decoding (8 or 11
significant bits); float32 and float64 must give equal tokens."""
