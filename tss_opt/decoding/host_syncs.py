"""Host <-> device traffic of the decode loop: uploads without a stream sync, and a counter
of the host reads of tensor values (device -> host syncs on a GPU).

:func:`upload` copies a small host tensor (token ids, positions, an index) to the device from
pinned memory with ``non_blocking=True``: a plain ``.to("cuda")`` of a pageable tensor waits
for the stream first (a sync per upload).

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


def upload(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` (a host tensor) on ``device``; to a GPU without waiting for the queued kernels.

    Pinned staging plus ``non_blocking=True``: the copy is queued on the stream, and torch's
    pinned allocator keeps the staging block until the copy has run. On the CPU: ``t`` itself.
    """
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


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
