"""The one skip mechanism: bypass a set of the target's decoder layers, per request.

Everything that skips layers (the engine, self-drafting, the search, the runtime controller)
goes through :meth:`SkipController.apply`. A skipped block returns its input hidden state
(``h[l+1] = h[l] if l in S else f_l(h[l])``, TSS.md). The model is never copied, reloaded or
restructured: the layer list and every ``layer_idx`` stay as they are (a shorter list with
renumbered indices reads other layers' keys/values, FACTS.md). Outside ``apply`` the layers
are untouched, also after an exception.

:meth:`SkipController.apply_rows` gives every batch row its own skip set (grouped trials,
issue 21): a layer that every row skips is bypassed, one that no row skips runs densely, and
a layer that some rows skip runs on the whole batch and the skipping rows keep their input
(``torch.where``). Which of the three a layer is stays fixed inside the context, so each
layer's KV cache grows consistently; the entries a skipping row writes at a mixed layer are
never read into that row's output (its output at that layer is its input), so every row gets
exactly what :meth:`SkipController.apply` with its own set gives.
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
        # Each entry: a skip set for every row, or per-row skip sets (apply_rows).
        self._stack: list[frozenset[int] | _Rows] = []
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
        """The skip set in force now (empty outside any context); under :meth:`apply_rows`,
        the layers that every row skips."""
        if not self._stack:
            return frozenset()
        top = self._stack[-1]
        return top if isinstance(top, frozenset) else frozenset.intersection(*top.rows)

    @property
    def active_rows(self) -> tuple[frozenset[int], ...] | None:
        """The per-row skip sets in force (:meth:`apply_rows`), or ``None`` for one set."""
        top = self._stack[-1] if self._stack else None
        return top.rows if isinstance(top, _Rows) else None

    @contextmanager
    def apply(self, skip: Iterable[int]) -> Iterator[frozenset[int]]:
        """Run the body with ``skip`` bypassed; the previous state returns on exit, always."""
        s = validate_skip(skip, self.num_layers)
        with self._pushed(s):
            yield s

    @contextmanager
    def apply_rows(self, row_skips: Sequence[Iterable[int]]) -> Iterator[tuple[frozenset[int], ...]]:
        """Run the body with batch row ``r`` bypassing ``row_skips[r]`` (module docstring).

        Every forward inside must have ``len(row_skips)`` batch rows. Contexts nest with
        :meth:`apply` as usual: the innermost is in force.

        Raises:
            SkipError: an empty ``row_skips`` or a layer index out of range.
        """
        rows = tuple(validate_skip(s, self.num_layers) for s in row_skips)
        if not rows:
            raise SkipError("apply_rows got no rows; pass one skip set per batch row")
        if len(set(rows)) == 1:
            with self._pushed(rows[0]):  # one set for all rows: plain skipping, no masks
                yield rows
            return
        with self._pushed(_Rows(rows, self.num_layers)):
            yield rows

    @contextmanager
    def _pushed(self, entry: frozenset[int] | _Rows) -> Iterator[None]:
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
            n_skip = top.skipping[idx]
            if n_skip == len(top.rows):
                return hidden_states  # every row bypasses: no forward, no cache write
            self.executed_layers += 1  # one forward of the whole batch
            out = dense_forward(hidden_states, *args, **kwargs)
            if n_skip == 0:
                return out
            # Mixed: the block runs on all rows (its cache grows for all); a skipping row
            # keeps its input, so what the block computed for it never reaches its output.
            return torch.where(top.mask(idx, hidden_states), hidden_states, out)

        return forward


class _Rows:
    """Per-row skip sets of one :meth:`SkipController.apply_rows` context.

    Attributes:
        rows: one skip set per batch row.
        skipping: per layer, how many rows skip it (all / none / some decides the path).
    """

    def __init__(self, rows: tuple[frozenset[int], ...], num_layers: int) -> None:
        self.rows = rows
        self.skipping = [sum(i in r for r in rows) for i in range(num_layers)]
        self._masks: dict[tuple[int, torch.device], torch.Tensor] = {}

    def mask(self, idx: int, hidden: torch.Tensor) -> torch.Tensor:
        """The bool ``(rows, 1, 1)`` mask of the rows that skip layer ``idx`` (built once)."""
        if hidden.shape[0] != len(self.rows):
            raise SkipError(
                f"apply_rows was given {len(self.rows)} row skip sets but the forward has batch size "
                f"{hidden.shape[0]}; pass one skip set per batch row"
            )
        key = (idx, hidden.device)
        m = self._masks.get(key)
        if m is None:
            m = torch.tensor([idx in r for r in self.rows], dtype=torch.bool).to(hidden.device)[:, None, None]
            self._masks[key] = m
        return m
