"""Build the shipped static tree ``tss_opt/data/trees/token_recycle_large.json``.

Run once by a developer, never at run time (the package reads the file):

    python scripts/build_tree_template.py [--out PATH] [--check]

The tree maximises the expected accepted length under a per-rank prior: assume the rank-``r``
candidate is the right next token with probability ``PRIOR[r]``, independently at every depth,
so a node's value is the product over its path. Greedily adding the most valuable node whose
parent is in the tree (Medusa's and Sequoia's construction) gives a tree that is wide near the
root and gives top-ranked children more descendants, the shape of Token Recycling's own static
tree. ``--check`` rebuilds it and exits 1 when the shipped file holds another tree.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from collections.abc import Sequence
from pathlib import Path

PRIOR = (0.5, 0.2, 0.1, 0.06, 0.04, 0.03, 0.02, 0.02)  # top-8 candidates
NUM_NODES = 72
MAX_DEPTH = 6
OUT = Path(__file__).resolve().parents[1] / "tss_opt" / "data" / "trees" / "token_recycle_large.json"
DESCRIPTION = (
    f"{NUM_NODES}-node static tree, depth {MAX_DEPTH}, levels 8/20/22/15/6/1. Built by "
    f"scripts/build_tree_template.py with the per-rank prior {list(PRIOR)} (top-8 candidates), "
    f"max_depth {MAX_DEPTH}: the nodes of greatest expected acceptance, so the tree is wide near "
    "the root and top-ranked children get more descendants, as in Token Recycling's static tree."
)


def best_first_tree(rank_accept: Sequence[float], num_nodes: int, max_depth: int) -> tuple[list[int], list[int]]:
    """``(parents, ranks)`` of the ``num_nodes`` nodes (root excluded) of greatest expected
    acceptance, numbered breadth-first (children by rank), so parents come first and each
    level is contiguous; a parent of ``-1`` is the root."""
    if num_nodes < 1 or max_depth < 1 or not rank_accept:
        raise ValueError(f"needs num_nodes >= 1, max_depth >= 1 and rank priors; got {num_nodes}, {max_depth}")
    parents: list[int] = []
    ranks: list[int] = []
    value: list[float] = []
    # heap of (-value, tie, parent, rank, depth)
    heap: list[tuple[float, int, int, int, int]] = [(-rank_accept[0], 0, -1, 0, 1)]
    tie = 1
    while heap and len(parents) < num_nodes:
        neg_v, _, p, r, d = heapq.heappop(heap)
        idx = len(parents)
        parents.append(p)
        ranks.append(r)
        value.append(-neg_v)
        parent_value = 1.0 if p < 0 else value[p]
        if r + 1 < len(rank_accept):  # the next sibling becomes available
            heapq.heappush(heap, (-(parent_value * rank_accept[r + 1]), tie, p, r + 1, d))
            tie += 1
        if d < max_depth:  # and this node's first child
            heapq.heappush(heap, (-(value[idx] * rank_accept[0]), tie, idx, 0, d + 1))
            tie += 1
    # Renumber breadth-first (children by rank): levels become contiguous, parents stay first.
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    order: list[int] = []
    frontier = sorted(kids.get(-1, []), key=lambda i: ranks[i])
    while frontier:
        order.extend(frontier)
        frontier = [c for i in frontier for c in sorted(kids.get(i, []), key=lambda c: ranks[c])]
    remap = {old: new for new, old in enumerate(order)}
    return [-1 if parents[o] < 0 else remap[parents[o]] for o in order], [ranks[o] for o in order]


def render(parents: Sequence[int], ranks: Sequence[int]) -> str:
    """The file's text: one key per line, each list on one line."""
    return (
        "{\n"
        f'  "name": {json.dumps(OUT.stem)},\n'
        f'  "description": {json.dumps(DESCRIPTION)},\n'
        f'  "parents": {json.dumps(list(parents))},\n'
        f'  "ranks": {json.dumps(list(ranks))}\n'
        "}\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help=f"where to write the tree (default {OUT})")
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = ap.parse_args(argv)
    parents, ranks = best_first_tree(PRIOR, NUM_NODES, MAX_DEPTH)
    if args.check:
        shipped = json.loads(args.out.read_text(encoding="utf-8"))
        same = shipped["parents"] == parents and shipped["ranks"] == ranks
        print(f"{args.out}: {'the tree this script builds' if same else 'ANOTHER tree than this script builds'}")
        return 0 if same else 1
    args.out.write_text(render(parents, ranks), encoding="utf-8")
    print(f"wrote {args.out} ({len(parents)} nodes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
