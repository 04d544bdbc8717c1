"""The one skip mechanism: bypass a set of the target's decoder layers, per request.

Everything that skips layers (the engine, self-drafting, the search, the runtime controller)
goes through :meth:`SkipController.apply`. A skipped block returns its input hidden state
(``h[l+1] = h[l] if l in S else f_l(h[l])``, TSS.md). The model is never copied, reloaded or
restructured: the layer list and every ``layer_idx`` stay as they are (a shorter list with
renumbered indices reads other layers' keys/values, FACTS.md). Outside ``apply`` the layers
are untouched, also after an exception.

:meth:`SkipController.apply_ragged` gives every row of a batch its own skip set (the batch
engine: the server's continuous batching and the replay evaluator's generations). The rows'
tokens are flattened into one sequence (``[1, T, hidden]``, each row with a cache of its own)
and a layer runs on the tokens of the rows that do not skip it only (gathered, run, scattered
back), so a skipped layer saves that row's compute, as multi-LoRA servers gather the rows of
each adapter. The rows running the
current layer are published on the plan (:attr:`RaggedPlan.active`) for the attention and the
per-row caches (``decoding/ragged.py``), and each row's executed layers are counted.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from tss_opt.errors import TSSError

_CONTROLLER_ATTR = "_tss_skip_controller"


class SkipError(TSSError):
    """A skip set that does not fit the model."""


def validate_skip(skip: Iterable[int], num_layers: int) -> frozenset[int]:
    """Check a skip set against the layer count and return it as a ``frozenset``."""
    out = frozenset(int(i) for i in skip)
    bad = sorted(i for i in out if not 0 <= i < num_layers)
    if bad:
        raise SkipError(
            f"skip layer(s) {bad} out of range: this model has {num_layers} decoder layers, "
            f"valid indices are 0..{num_layers - 1}"
        )
    return out


class SkipController:
    """Owns the skip state of one model. Get it with :meth:`for_model`.

    Contexts nest (self-drafting applies a larger skip set inside a request's context); the
    innermost one is in force, and leaving the outermost restores every layer's ``forward``.
    """

    def __init__(self, model: torch.nn.Module, layers_path: str = "model.layers") -> None:
        try:
            self.layers = operator.attrgetter(layers_path)(model)
        except AttributeError as e:
            raise SkipError(
                f"cannot find the decoder layers at {layers_path!r} in {type(model).__name__}; "
                "set model.layers_path in the model's config"
            ) from e
        self.num_layers = len(self.layers)
        # Each entry: a skip set for every row, or a ragged batch of rows with their own
        # skip sets and caches (apply_ragged).
        self._stack: list[frozenset[int] | RaggedPlan] = []
        self.executed_layers = 0  # layer-forwards actually run while a context is active

    @classmethod
    def for_model(cls, model: torch.nn.Module, layers_path: str = "model.layers") -> SkipController:
        ctrl = getattr(model, _CONTROLLER_ATTR, None)
        if ctrl is None:
            ctrl = cls(model, layers_path)
            # Plain attribute on the module object (not a submodule, not in state_dict).
            object.__setattr__(model, _CONTROLLER_ATTR, ctrl)
        return ctrl

    @property
    def active(self) -> frozenset[int]:
        """The skip set in force now (empty outside any context); under :meth:`apply_ragged`,
        the layers that every row skips."""
        if not self._stack:
            return frozenset()
        top = self._stack[-1]
        return top if isinstance(top, frozenset) else frozenset.intersection(*top.rows)

    @contextmanager
    def apply_ragged(self, plan: RaggedPlan) -> Iterator[RaggedPlan]:
        """Run the body with a ragged batch: row ``r``'s tokens bypass ``plan.rows[r]``
        (module docstring). Every forward inside must carry ``plan.total`` tokens."""
        if plan.num_layers != self.num_layers:
            raise SkipError(f"the ragged plan is for {plan.num_layers} layers but the model has {self.num_layers}")
        with self._pushed(plan):
            yield plan

    @property
    def batched(self) -> bool:
        """Whether per-row skip sets (:meth:`apply_ragged`) are in force rather than one set
        for the whole forward."""
        return bool(self._stack) and not isinstance(self._stack[-1], frozenset)

    @contextmanager
    def apply(self, skip: Iterable[int]) -> Iterator[frozenset[int]]:
        """Run the body with ``skip`` bypassed; the previous state returns on exit, always."""
        s = validate_skip(skip, self.num_layers)
        with self._pushed(s):
            yield s

    @contextmanager
    def _pushed(self, entry: frozenset[int] | RaggedPlan) -> Iterator[None]:
        if not self._stack:
            self._install()
        self._stack.append(entry)
        try:
            yield
        finally:
            self._stack.pop()
            if not self._stack:
                self._uninstall()

    # The patch is an instance attribute shadowing the class's ``forward``; hooks and the
    # module tree are unchanged, and deleting it restores the class method exactly.
    def _install(self) -> None:
        for idx, layer in enumerate(self.layers):
            layer.forward = self._make_forward(idx, layer.forward)

    def _uninstall(self) -> None:
        for layer in self.layers:
            layer.__dict__.pop("forward", None)

    def _make_forward(self, idx: int, dense_forward: Any) -> Any:
        def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            top = self._stack[-1]
            if isinstance(top, frozenset):
                if idx in top:
                    return hidden_states  # bypass: the block's input flows on unchanged
                self.executed_layers += 1
                return dense_forward(hidden_states, *args, **kwargs)
            return self._ragged_forward(top, idx, dense_forward, hidden_states, args, kwargs)

        return forward

    def _ragged_forward(
        self, plan: RaggedPlan, idx: int, dense_forward: Any, hidden: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> torch.Tensor:
        """Layer ``idx`` on the tokens of the rows that run it; the others pass unchanged.

        Args:
            hidden: ``[1, T, hidden]``: every row's tokens, row after row.
        """
        running = plan.enter(idx)
        if not running:
            return hidden  # every row bypasses: no forward, no cache write
        self.executed_layers += 1
        index = plan.index(idx)
        if index is None:  # every row runs it: no gather
            return dense_forward(hidden, *args, **kwargs)
        # Gather the running rows' tokens (and their positions), run, scatter back: the
        # skipping rows cost nothing at this layer.
        sub = hidden.index_select(1, index)
        out = dense_forward(sub, *args, **plan.sliced(kwargs, idx))
        return hidden.index_copy(1, index, out)


class RaggedPlan:
    """Per-row skip sets over a flattened batch of rows (:meth:`SkipController.apply_ragged`).

    Args:
        rows: one skip set per row (validated).
        lengths: tokens of each row in the flattened sequence, row after row.
        num_layers: the model's decoder layers.
        device: where the token indices live.

    Attributes:
        active: the rows running the current layer, in order (set as each layer starts;
            what the per-row caches and the attention read).
        executed: per row, the decoder-layer forwards that ran on its tokens.
    """

    def __init__(
        self, rows: Sequence[frozenset[int]], lengths: Sequence[int], num_layers: int, device: torch.device | str
    ) -> None:
        if len(rows) != len(lengths) or not rows:
            raise SkipError(f"a ragged plan needs one skip set per row; got {len(rows)} sets for {len(lengths)} rows")
        self.rows = tuple(rows)
        self.lengths = tuple(int(n) for n in lengths)
        self.num_layers = num_layers
        self.total = sum(self.lengths)
        self.device = device
        self.active: tuple[int, ...] = ()
        self.executed = [0] * len(self.rows)
        starts = [0]
        for n in self.lengths[:-1]:
            starts.append(starts[-1] + n)
        self.starts = tuple(starts)
        # Layers with the same running rows share one index (and one slice of the positions).
        self._running = [tuple(r for r, s in enumerate(self.rows) if i not in s) for i in range(num_layers)]
        self._index: dict[tuple[int, ...], torch.Tensor] = {}
        self._sliced: dict[tuple[int, ...], dict[str, Any]] = {}

    def enter(self, idx: int) -> tuple[int, ...]:
        """Layer ``idx`` starts: publish and count the rows that run it."""
        running = self._running[idx]
        self.active = running
        for r in running:
            self.executed[r] += 1
        return running

    def index(self, idx: int) -> torch.Tensor | None:
        """The flattened positions of the rows running layer ``idx`` (``None``: all rows)."""
        running = self._running[idx]
        if len(running) == len(self.rows):
            return None
        index = self._index.get(running)
        if index is None:
            index = torch.cat([torch.arange(self.starts[r], self.starts[r] + self.lengths[r]) for r in running])
            index = self._index[running] = index.to(self.device)
        return index

    def sliced(self, kwargs: dict[str, Any], idx: int) -> dict[str, Any]:
        """The layer's keyword arguments with the per-token ones (rotary embeddings,
        positions) cut to the running rows' tokens (computed once per distinct set of rows)."""
        running = self._running[idx]
        cached = self._sliced.get(running)
        if cached is None:
            index = self.index(idx)
            cached = {}
            pe = kwargs.get("position_embeddings")
            if isinstance(pe, tuple):
                cached["position_embeddings"] = tuple(t.index_select(1, index) for t in pe)
            pos = kwargs.get("position_ids")
            if isinstance(pos, torch.Tensor):
                cached["position_ids"] = pos.index_select(1, index)
            self._sliced[running] = cached
        return {**kwargs, **cached}
