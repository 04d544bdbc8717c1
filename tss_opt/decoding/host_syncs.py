"""Count the host reads of tensor values (device -> host syncs on a GPU) in a block of code.

On a GPU every ``.item()``, ``.tolist()``, ``.cpu()``, ``int(t)``, ``float(t)`` and
``bool(t)`` of a device tensor waits for the queued kernels: the decode loop pays one round
trip per read. :func:`count_host_syncs` patches those ``torch.Tensor`` methods for the block
and counts the calls; with ``device="cuda"`` only calls on tensors of that device type count
(the real syncs), with ``device=None`` every call counts (on a CPU, an upper bound: reads of
host tensors count too). Used by tests/decoding/test_host_syncs.py and benchmarks/gpu_check.py;
docs/engine.md lists the numbers per drafter.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import torch

METHODS = ("item", "tolist", "cpu", "__int__", "__float__", "__bool__", "__index__")


@contextmanager
def count_host_syncs(device: str | None = None) -> Iterator[Counter[str]]:
    """Count value reads by method name while the block runs (restored in ``finally``).

    Args:
        device: a device type (``"cuda"``) whose tensors count; ``None`` counts every tensor.

    Yields:
        A ``Counter`` of method name -> calls (its ``total()`` is the number of reads).
    """
    counts: Counter[str] = Counter()
    originals = {name: getattr(torch.Tensor, name) for name in METHODS}

    def wrap(name: str):  # noqa: ANN202
        orig = originals[name]

        def counted(self: torch.Tensor, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            if device is None or self.device.type == device:
                counts[name] += 1
            return orig(self, *args, **kwargs)

        return counted

    try:
        for name in METHODS:
            setattr(torch.Tensor, name, wrap(name))
        yield counts
    finally:
        for name, orig in originals.items():
            setattr(torch.Tensor, name, orig)
