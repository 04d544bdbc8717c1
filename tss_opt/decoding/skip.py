"""The one skip mechanism: bypass a set of the target's decoder layers, per request.

Everything that skips layers (the engine, self-drafting, the search, the runtime controller)
goes through :meth:`SkipController.apply`. A skipped block returns its input hidden state
(``h[l+1] = h[l] if l in S else f_l(h[l])``, TSS.md). The model is never copied, reloaded or
restructured: the layer list and every ``layer_idx`` stay as they are (a shorter list with
renumbered indices reads other layers' keys/values, FACTS.md). Outside ``apply`` the layers
are untouched, also after an exception.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
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
        self._stack: list[frozenset[int]] = []
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
        """The skip set in force now (empty outside any context)."""
        return self._stack[-1] if self._stack else frozenset()

    @contextmanager
    def apply(self, skip: Iterable[int]) -> Iterator[frozenset[int]]:
        """Run the body with ``skip`` bypassed; the previous state returns on exit, always."""
        s = validate_skip(skip, self.num_layers)
        if not self._stack:
            self._install()
        self._stack.append(s)
        try:
            yield s
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
            if idx in self.active:
                return hidden_states  # bypass: the block's input flows on unchanged
            self.executed_layers += 1
            return dense_forward(hidden_states, *args, **kwargs)

        return forward
