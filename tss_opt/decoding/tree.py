"""Draft trees: the one shape every drafter proposes and the engine verifies.

A draft is a tree of candidate tokens hanging below the *root*, the last committed token
(whose key/value is not yet in the target's cache). A chain of ``k`` tokens is the
one-branch tree with parents ``(-1, 0, 1, ..., k-2)``, so the engine has a single
verification path for chains and trees alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

ROOT = -1
"""Parent index of a node that hangs directly below the root (the last committed token)."""


@dataclass(frozen=True)
class DraftTree:
    """Candidate tokens with parent links, in topological order (parents before children).

    Attributes:
        tokens: ``torch.LongTensor`` of shape ``(n,)``: the drafted token of every node.
        parents: tuple of ``n`` ints: ``parents[i]`` is the index of node ``i``'s parent,
            ``-1`` (:data:`ROOT`) for a child of the root; always ``parents[i] < i``.
        probs: optional ``torch.FloatTensor`` of shape ``(n, vocab)``: the drafter's
            distribution ``q`` from which node ``i``'s token was drawn, given its ancestors.
            Needed only for speculative sampling (temperature > 0); ``None`` means the
            drafter is deterministic (``q`` is one-hot at the drafted token).
        confidence: optional ``torch.FloatTensor`` of shape ``(n,)``: the drafter's estimate,
            in ``[0, 1]``, that node ``i`` is the target's next token given that its
            ancestors were accepted (a local, not a path, probability). Read by confidence
            routing (``drafter=routed``); ``None`` means the drafter gives none.
        sampled: whether node tokens were *drawn* from ``probs`` (speculative sampling
            applies). ``False``: the tokens were chosen deterministically (the argmax of a
            greedy draft model) and ``probs`` only describe the drafter's distribution, for
            relaxed verification (``verification=diversed|cospec``); exact verification then
            treats the draft as deterministic.
    """

    tokens: torch.Tensor
    parents: tuple[int, ...]
    probs: torch.Tensor | None = None
    confidence: torch.Tensor | None = None
    sampled: bool = True
    _depth: tuple[int, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        n = int(self.tokens.numel())
        if self.tokens.dim() != 1:
            raise ValueError(f"DraftTree.tokens must be 1-D, got shape {tuple(self.tokens.shape)}")
        if len(self.parents) != n:
            raise ValueError(
                f"DraftTree has {n} tokens but {len(self.parents)} parent links; give one parent per token"
            )
        depth: list[int] = []
        for i, p in enumerate(self.parents):
            if not (p == ROOT or 0 <= p < i):
                raise ValueError(
                    f"DraftTree node {i} has parent {p}; expected -1 (the root) or an earlier node 0..{i - 1}"
                )
            depth.append(1 if p == ROOT else depth[p] + 1)
        if self.probs is not None and tuple(self.probs.shape[:1]) != (n,):
            raise ValueError(f"DraftTree.probs must have shape (n={n}, vocab), got {tuple(self.probs.shape)}")
        if self.confidence is not None and tuple(self.confidence.shape) != (n,):
            raise ValueError(
                f"DraftTree.confidence must have shape (n={n},), got {tuple(self.confidence.shape)}"
            )
        object.__setattr__(self, "_depth", tuple(depth))

    # ----------------------------------------------------------------------------- builders
    @classmethod
    def chain(
        cls,
        tokens: torch.Tensor | Sequence[int],
        probs: torch.Tensor | None = None,
        confidence: torch.Tensor | None = None,
        sampled: bool = True,
    ) -> DraftTree:
        """A one-branch tree: ``tokens[i]`` is the child of ``tokens[i-1]``."""
        t = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        return cls(
            tokens=t,
            parents=tuple(range(-1, int(t.numel()) - 1)),
            probs=probs,
            confidence=confidence,
            sampled=sampled,
        )

    @classmethod
    def empty(cls) -> DraftTree:
        """No candidates: the verification step commits only the target's own next token."""
        return cls(tokens=torch.empty(0, dtype=torch.long), parents=())

    # ----------------------------------------------------------------------------- queries
    def __len__(self) -> int:
        return int(self.tokens.numel())

    @property
    def depth(self) -> tuple[int, ...]:
        """Depth of every node; children of the root have depth 1."""
        return self._depth

    @property
    def sampled_probs(self) -> torch.Tensor | None:
        """``probs`` when the tokens were drawn from them (speculative sampling), else ``None``."""
        return self.probs if self.sampled else None

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def children(self) -> list[list[int]]:
        """``children()[p + 1]`` lists the children of node ``p`` (index 0 is the root)."""
        kids: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parents):
            kids[p + 1].append(i)
        return kids

    def ancestor_matrix(self) -> torch.Tensor:
        """``torch.BoolTensor`` of shape ``(n + 1, n + 1)`` over ``[root, node_0, ...]``:
        entry ``[i, j]`` is True when row ``i`` may attend to column ``j`` (an ancestor or
        itself). The root is everyone's ancestor."""
        n = len(self)
        allowed = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        allowed[:, 0] = True
        for i, p in enumerate(self.parents):
            row = i + 1
            allowed[row] = allowed[p + 1]
            allowed[row, row] = True
        return allowed
