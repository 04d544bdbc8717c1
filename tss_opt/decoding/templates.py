"""Static draft-tree templates as data: loading, validation and a best-first builder.

A template describes the *shape* of a static draft tree, independent of any token: node ``i``
hangs below ``parents[i]`` (``-1`` = the root, the last committed token) and takes the
``ranks[i]``-th candidate of its parent's token (rank 0 = the most likely next token). Token
Recycling (Luo et al. 2024, arXiv 2408.08696) fills such a template from its adjacency table.

JSON format (``tss_opt/data/trees/*.json``)::

    {"name": "token_recycle_15",
     "description": "...",
     "parents": [-1, 0, 0, 0, 0, 1, 1, ...],
     "ranks":   [ 0, 0, 1, 2, 3, 0, 1, ...]}

``ranks`` is optional: without it a node takes the rank of its position among its parent's
children (the first child listed takes rank 0). Nodes must be listed parents-first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tss_opt.errors import TSSError

BUILTIN_PREFIX = "builtin:"
# Shipped as package data (pyproject: data/trees/*.json); located relative to this file so it
# works from a checkout and after ``pip install`` alike.
# tss_opt/data/trees, found from the package root (this file is tss_opt/decoding/drafters/).
TREES_DIR = Path(__file__).resolve().parents[1] / "data" / "trees"


class TemplateError(TSSError):
    """A tree template is malformed or does not fit the drafter's limits."""


@dataclass(frozen=True)
class TreeTemplate:
    """A validated static tree shape.

    Attributes:
        parents: ``parents[i]`` is node ``i``'s parent (``-1`` = root); always ``< i``.
        ranks: ``ranks[i]`` is the candidate rank node ``i`` takes among its parent's
            next-token candidates; distinct among siblings.
        name: a label for reports.
    """

    parents: tuple[int, ...]
    ranks: tuple[int, ...]
    name: str = "template"

    def __post_init__(self) -> None:
        validate_template(self.parents, self.ranks, where=self.name)

    def __len__(self) -> int:
        return len(self.parents)

    @property
    def depths(self) -> tuple[int, ...]:
        """Depth of every node; children of the root have depth 1."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return tuple(out)

    @property
    def max_depth(self) -> int:
        return max(self.depths, default=0)

    @property
    def max_rank(self) -> int:
        return max(self.ranks, default=-1)

    def level_sizes(self) -> list[int]:
        """Number of nodes at depth 1, 2, ... (e.g. ``[1, 4, 8, 2]``)."""
        sizes = [0] * self.max_depth
        for d in self.depths:
            sizes[d - 1] += 1
        return sizes

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "parents": list(self.parents), "ranks": list(self.ranks)}


def _ranks_from_order(parents: Sequence[int]) -> list[int]:
    seen: dict[int, int] = {}
    ranks = []
    for p in parents:
        ranks.append(seen.get(p, 0))
        seen[p] = seen.get(p, 0) + 1
    return ranks


def validate_template(
    parents: Sequence[Any],
    ranks: Sequence[Any],
    *,
    where: str = "template",
    max_nodes: int | None = None,
) -> None:
    """Raise :class:`TemplateError` naming the first offending node.

    Checks: integer entries; ``parents`` and ``ranks`` of equal length; every parent is ``-1``
    or an existing node; no cycles; parents listed before children; ranks non-negative and
    distinct among siblings; at most ``max_nodes`` nodes.
    """
    n = len(parents)
    if max_nodes is not None and n > max_nodes:
        raise TemplateError(
            f"{where}: {n} nodes exceed the budget of {max_nodes}; use a smaller template or raise max_nodes"
        )
    if len(ranks) != n:
        raise TemplateError(
            f"{where}: {n} parents but {len(ranks)} ranks; give one rank per node or omit 'ranks'"
        )
    for i, (p, r) in enumerate(zip(parents, ranks, strict=True)):
        if isinstance(p, bool) or not isinstance(p, int):
            raise TemplateError(
                f"{where}: node {i} has parent {p!r}; expected an integer node index or -1 (the root)"
            )
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise TemplateError(
                f"{where}: node {i} has rank {r!r}; expected a non-negative integer"
            )
        if p < -1 or p >= n:
            raise TemplateError(
                f"{where}: node {i} has parent {p}, which is not a node (missing parent); "
                f"expected -1 (the root) or 0..{n - 1}"
            )
        if p == i:
            raise TemplateError(
                f"{where}: node {i} is its own parent (a cycle); a node's parent must come before it"
            )
    for i, p in enumerate(parents):
        if p > i:
            # Follow the parent links: either they loop (not a tree) or the order is wrong.
            seen = {i}
            q = p
            while q != -1 and q not in seen:
                seen.add(q)
                q = parents[q]
            if q != -1:
                raise TemplateError(
                    f"{where}: node {i} is on a cycle of parent links ({sorted(seen)}); a tree's links must lead to the root (-1)"
                )
            raise TemplateError(
                f"{where}: node {i} has parent {p}, listed after it (parent after child); "
                "list every node after its parent (topological order)"
            )
    sibling_ranks: dict[int, dict[int, int]] = {}
    for i, (p, r) in enumerate(zip(parents, ranks, strict=True)):
        taken = sibling_ranks.setdefault(p, {})
        if r in taken:
            raise TemplateError(
                f"{where}: node {i} takes rank {r} of parent {p}, already taken by node {taken[r]}; "
                "siblings need distinct ranks"
            )
        taken[r] = i


def template_from_mapping(
    data: Mapping[str, Any], *, name: str = "template", max_nodes: int | None = None
) -> TreeTemplate:
    """Build a :class:`TreeTemplate` from a decoded JSON object (``parents`` [+ ``ranks``])."""
    if "parents" not in data:
        raise TemplateError(
            f"{name}: no 'parents' list; a template needs 'parents' (and optionally 'ranks')"
        )
    parents = list(data["parents"])
    ranks = list(data["ranks"]) if data.get("ranks") is not None else _ranks_from_order(parents)
    label = str(data.get("name", name))
    validate_template(parents, ranks, where=label, max_nodes=max_nodes)
    return TreeTemplate(parents=tuple(parents), ranks=tuple(ranks), name=label)


def builtin_templates() -> list[str]:
    """Names of the templates shipped in ``tss_opt/data/trees``."""
    return sorted(p.name for p in TREES_DIR.glob("*.json"))


def load_template(
    source: str | Path | Mapping[str, Any] | TreeTemplate, *, max_nodes: int | None = None
) -> TreeTemplate:
    """Load and validate a template.

    Args:
        source: ``"builtin:<file>.json"`` (shipped with the package), a path to a JSON file,
            a decoded mapping, or a :class:`TreeTemplate`.
        max_nodes: node budget; more nodes raise :class:`TemplateError`.
    """
    if isinstance(source, TreeTemplate):
        validate_template(source.parents, source.ranks, where=source.name, max_nodes=max_nodes)
        return source
    if isinstance(source, Mapping):
        return template_from_mapping(source, max_nodes=max_nodes)
    text_src = str(source)
    if text_src.startswith(BUILTIN_PREFIX):
        fname = text_src[len(BUILTIN_PREFIX) :]
        res = TREES_DIR / fname
        if not res.is_file():
            raise TemplateError(
                f"no builtin tree template {fname!r}; available: {', '.join(builtin_templates())}"
            )
        text, label = res.read_text(encoding="utf-8"), fname
    else:
        path = Path(text_src)
        if not path.is_file():
            raise TemplateError(
                f"tree template file {path} not found; give a JSON file path or one of "
                + ", ".join(BUILTIN_PREFIX + n for n in builtin_templates())
            )
        text, label = path.read_text(encoding="utf-8"), str(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TemplateError(f"tree template {label} is not valid JSON: {e}") from e
    if not isinstance(data, Mapping):
        raise TemplateError(
            f"tree template {label} must hold a JSON object with 'parents', got {type(data).__name__}"
        )
    return template_from_mapping(data, name=label, max_nodes=max_nodes)
