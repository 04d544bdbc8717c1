"""Compiled graphs called directly, past dynamo's frame, once dynamo has shown which one runs.

A compiled plain step on a CPU calls its graphs 31 times (one per running layer, one for the
head). Each call through ``torch.compile``'s frame costs about 70 us before the graph runs:
dynamo's cache lookup and guard check (38 us, with :func:`~tss_opt.decoding.compiled.tensor_guards`
already trimming the guards), the compiled region's own bookkeeping (24 us) and the bytecode
that gathers the graph's inputs (8 us). That is 2 ms of a 19 ms bfloat16 step (SmolLM2, one
thread, the AMD EPYC of docs/engine.md; profiled). Dynamo needs that work to pick the graph and
gather its inputs from the call's arguments; here the caller tells which graph applies
(a ``key``: for the compiled step, the bucket of slots), so after dynamo has served a key
once, later calls with that key run the same graph with the same inputs directly.

The switch is checked, not assumed. :class:`DirectCompiled` records, in the backend, each
graph's inputs as the sources dynamo gave them (``L['layer']._modules['mlp']...``, a tensor's
size), and on a call through dynamo the inputs and outputs that graph actually saw. A key
becomes direct only where its calls have compiled exactly one graph (a decoder whose layers
need graphs of their own, say by branching on ``layer_idx``, compiles a second one at its
second layer: that key stays with dynamo for good), after a call of it through dynamo that
compiled nothing (the graph was reused: for the layer step, a second layer ran the first
one's graph) and in which

* every input the sources give is the very object dynamo passed (identity; sizes equal),
* every value the function returned is one of the graph's outputs (identity), and
* every size the caller says may vary under one key (``varying``: the attention window, the
  cache buffers' length) is an input of the graph, not a constant compiled into it.

Otherwise the key stays with dynamo (its every call guarded as before). What this gives up:
dynamo's guards on a direct key, so the caller's key must cover everything that picks a graph
(the compiled step's shapes are fixed but for the bucket and the ``varying`` sizes). The
outputs are the same graph's, so the results are bit-identical to calls through dynamo
(tests/decoding/test_direct.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

__all__ = ["DirectCompiled", "source_getter"]

Getter = Callable[[Sequence[Any]], Any]

_ROOT = re.compile(r"L\['(\w+)'\]")
_STEP = re.compile(r"\._(?:modules|parameters|buffers)\['([\w.]+)'\]|\.size\(\)\[(\d+)\]|\.(\w+)|\[(\d+)\]")


def source_getter(source: str, params: Sequence[str]) -> Getter | None:
    """A function of the call's positional arguments that returns what ``source`` names.

    Args:
        source: a dynamo source name of a graph input, e.g.
            ``L['layer']._modules['mlp']._parameters['weight']`` or ``L['mask'].size()[3]``.
        params: the compiled function's parameter names, in order.

    Returns:
        The getter, or ``None`` where the source is not a chain this module reads (a global,
        a closure cell, a call): such a graph stays with dynamo.
    """
    root = _ROOT.match(source)
    if root is None or root.group(1) not in params:
        return None
    index = list(params).index(root.group(1))
    steps: list[Callable[[Any], Any]] = []
    pos = root.end()
    while pos < len(source):
        m = _STEP.match(source, pos)
        if m is None:
            return None
        name, size, attr, item = m.groups()
        if name is not None:
            kind = m.group(0)[2:].split("[", 1)[0]  # modules, parameters or buffers
            steps.append(lambda o, k=kind, n=name: getattr(o, "_" + k)[n])
        elif size is not None:
            steps.append(lambda o, i=int(size): o.size(i))
        elif attr is not None:
            steps.append(lambda o, a=attr: getattr(o, a))
        else:
            steps.append(lambda o, i=int(item): o[i])
        pos = m.end()

    def get(args: Sequence[Any]) -> Any:
        value = args[index]
        for step in steps:
            value = step(value)
        return value

    return get


class _Graph:
    """One compiled graph: its inputs' getters (``None`` where a source is not readable) and
    sources, the backend's callable, and the inputs and outputs of its last call."""

    def __init__(self, gm: torch.fx.GraphModule, compiled: Callable[..., Any], params: Sequence[str]) -> None:
        self.sources: list[str] = []
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                arg = node.meta.get("grapharg")
                self.sources.append(arg.source.name if arg is not None and arg.source is not None else "")
        found = [source_getter(s, params) for s in self.sources]
        self.getters: list[Getter] | None = None if any(g is None for g in found) else found  # type: ignore[assignment]
        self.compiled = compiled

    def inputs(self, args: Sequence[Any]) -> list[Any]:
        assert self.getters is not None
        return [get(args) for get in self.getters]


def _same(a: Any, b: Any) -> bool:
    """The same input: the same tensor object, or an equal size."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    return bool(a == b)


def _picker(result: Any, outputs: Sequence[Any]) -> Callable[[Sequence[Any]], Any] | None:
    """How the function's ``result`` (a tensor or a tuple of tensors) is read off the graph's
    ``outputs``, by identity; ``None`` where some part of it is not one of them."""
    def where(t: Any) -> int | None:
        return next((i for i, o in enumerate(outputs) if o is t), None) if isinstance(t, torch.Tensor) else None

    if isinstance(result, tuple):
        idx = [where(t) for t in result]
        if any(i is None for i in idx):
            return None
        return lambda out: tuple(out[i] for i in idx)  # type: ignore[index]
    i = where(result)
    return None if i is None else (lambda out: out[i])


class DirectCompiled:
    """``torch.compile(fn, ...)`` whose calls go directly to the compiled graph once checked.

    Args:
        fn: the function to compile; called with positional arguments only.
        backend: the compile backend (``(gm, example_inputs) -> callable``).
        varying: the sources of sizes that may change between calls of one key (they must be
            graph inputs for the key to go direct), e.g. ``{"L['mask'].size()[3]"}``.
        enabled: ``False``: every call through dynamo (the benchmarks' side-by-side arm).
        **compile_kwargs: passed on to ``torch.compile`` (``fullgraph``, ``dynamic``, ``options``).

    Attributes:
        direct: the keys whose calls go directly to their graph.
        direct_calls: calls that did (for tests and benchmarks).
    """

    def __init__(
        self, fn: Callable[..., Any], backend: Callable[..., Any], varying: frozenset[str] = frozenset(),
        enabled: bool = True, **compile_kwargs: Any,
    ) -> None:
        code = fn.__code__
        self.enabled = enabled
        self.params = code.co_varnames[: code.co_argcount]
        self.varying = varying
        self.direct: dict[Hashable, tuple[_Graph, Callable[[Sequence[Any]], Any]]] = {}
        self.direct_calls = 0
        self._compiles = 0
        self._compiled_for: dict[Hashable, int] = {}  # graphs compiled during each key's calls
        self._last: tuple[_Graph, tuple[Any, ...], Any] | None = None

        def recording(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
            self._compiles += 1
            graph = _Graph(gm, backend(gm, example_inputs), self.params)

            def run(*args: Any) -> Any:
                out = graph.compiled(*args)
                self._last = (graph, args, out)
                return out

            return run

        self._dynamo = torch.compile(fn, backend=recording, **compile_kwargs)

    def __call__(self, key: Hashable, *args: Any) -> Any:
        """``fn(*args)``: directly through ``key``'s graph once checked, else through dynamo.

        ``key`` must tell apart every call that could run another graph (see the module's
        docstring); calls of one key may differ only in tensors of the same shapes, strides
        and dtypes and in the ``varying`` sizes."""
        hit = self.direct.get(key)
        if hit is not None:
            graph, pick = hit
            self.direct_calls += 1
            return pick(graph.compiled(*graph.inputs(args)))
        compiles, self._last = self._compiles, None
        result = self._dynamo(*args)
        last, self._last = self._last, None  # drop the references to this call's tensors
        self._compiled_for[key] = self._compiled_for.get(key, 0) + self._compiles - compiles
        if self.enabled and compiles == self._compiles and self._compiled_for[key] == 1 and last is not None:
            self._check(key, args, result, *last)
        return result

    def _check(self, key: Hashable, args: tuple[Any, ...], result: Any, graph: _Graph, seen: tuple[Any, ...], outputs: Any) -> None:
        """Make ``key`` direct if the call dynamo just served reads as the module's docstring says."""
        if graph.getters is None or not self.varying <= set(graph.sources):
            return
        mine = graph.inputs(args)
        if len(mine) != len(seen) or not all(_same(a, b) for a, b in zip(mine, seen)):
            return
        pick = _picker(result, outputs) if isinstance(outputs, (tuple, list)) else None
        if pick is not None:
            self.direct[key] = (graph, pick)
