"""Token Recycling: the adjacency table, template expansion, and the tree templates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tss_opt.decoding.drafters import (
    TemplateError,
    TokenRecycleDrafter,
    TreeTemplate,
    VerifyFeedback,
    load_template,
)
from tss_opt.decoding.drafters.token_recycle import AdjacencyTable
from tss_opt.decoding.templates import builtin_templates
from tss_opt.decoding.tree import DraftTree

V = 10


def logits_ranking(*order: int, vocab: int = V) -> torch.Tensor:
    """A logits row whose top tokens are ``order`` (rank 0 first)."""
    row = torch.zeros(vocab)
    for rank, tok in enumerate(order):
        row[tok] = 10.0 - rank
    return row


# ----------------------------------------------------------------------------- table
def test_table_stores_top_k_rows() -> None:
    table = AdjacencyTable(V, k=3)
    logits = torch.stack([logits_ranking(4, 2, 7), logits_ranking(1, 0, 9)])
    table.store(torch.tensor([5, 3]), logits)
    assert table.candidates[5].tolist() == [4, 2, 7]
    assert table.candidates[3].tolist() == [1, 0, 9]
    assert table.filled.nonzero().reshape(-1).tolist() == [3, 5]
    # A later observation replaces the row.
    table.store(torch.tensor([5]), logits_ranking(8, 6, 1)[None])
    assert table.candidates[5].tolist() == [8, 6, 1]


def test_table_duplicate_tokens_first_row_wins() -> None:
    table = AdjacencyTable(V, k=2)
    logits = torch.stack([logits_ranking(1, 2), logits_ranking(3, 4), logits_ranking(5, 6)])
    table.store(torch.tensor([7, 8, 7]), logits)
    assert table.candidates[7].tolist() == [1, 2]
    assert table.candidates[8].tolist() == [3, 4]


def test_table_rejects_other_vocabulary() -> None:
    table = AdjacencyTable(V, k=2)
    with pytest.raises(ValueError, match="vocabulary of 10"):
        table.store(torch.tensor([1]), torch.zeros(1, 12))


def test_update_uses_root_and_every_node_row() -> None:
    d = TokenRecycleDrafter({"parents": [-1, 0]}, top_k=2)
    tree = DraftTree(tokens=torch.tensor([6, 2, 9]), parents=(-1, -1, 0))
    logits = torch.stack(
        [logits_ranking(6, 2), logits_ranking(9, 1), logits_ranking(3, 4), logits_ranking(0, 8)]
    )
    fb = VerifyFeedback(
        tree=tree,
        accepted=(0, 2),
        committed=torch.tensor([6, 9, 0]),
        logits=logits,
        hidden=torch.zeros(4, 3),
        root_token=5,
    )
    d.update(fb)
    assert d.table is not None
    assert d.table.candidates[5].tolist() == [6, 2]  # root row
    assert d.table.candidates[6].tolist() == [9, 1]  # node 0
    assert d.table.candidates[2].tolist() == [3, 4]  # node 1 (rejected, still recycled)
    assert d.table.candidates[9].tolist() == [0, 8]  # node 2
    assert d.table.filled.sum() == 4


def test_prefill_feedback_fills_last_prompt_token() -> None:
    d = TokenRecycleDrafter({"parents": [-1, -1, 0]}, top_k=2)
    d.prefill_feedback(torch.tensor([3, 1, 4]), logits_ranking(7, 8)[None], torch.zeros(3, 2))
    assert d.table is not None and d.table.filled.nonzero().reshape(-1).tolist() == [4]
    assert d.table.candidates[4].tolist() == [7, 8]
    tree = d.propose(torch.tensor([3, 1, 4]))  # token 7 has no row yet: node 2 is pruned
    assert tree.tokens.tolist() == [7, 8] and tree.parents == (-1, -1)


# ----------------------------------------------------------------------------- expansion
def _hand_filled(template: dict, rows: dict[int, list[int]], top_k: int = 3) -> TokenRecycleDrafter:
    d = TokenRecycleDrafter(template, top_k=top_k)
    d.table = AdjacencyTable(V, top_k)
    for tok, cands in rows.items():
        d.table.candidates[tok] = torch.tensor(cands)
        d.table.filled[tok] = True
    return d


def test_expansion_from_hand_filled_table() -> None:
    # root -> a (rank 0), b (rank 1); a -> c (rank 0), d (rank 2); b -> e (rank 0); c -> f (rank 1)
    template = {"parents": [-1, -1, 0, 0, 1, 2], "ranks": [0, 1, 0, 2, 0, 1]}
    d = _hand_filled(template, {1: [2, 3, 4], 2: [5, 6, 7], 3: [8, 9, 0], 5: [1, 4, 6]})
    tree = d.propose(torch.tensor([9, 9, 1]))  # root token 1
    assert tree.tokens.tolist() == [2, 3, 5, 7, 8, 4]
    assert tree.parents == (-1, -1, 0, 0, 1, 2)


def test_expansion_prunes_subtrees_of_unknown_tokens() -> None:
    template = {"parents": [-1, -1, 0, 0, 1, 2], "ranks": [0, 1, 0, 2, 0, 1]}
    # Token 3 (root's rank-1 candidate) has no row: node 4 goes; token 5 has none: node 5 goes.
    d = _hand_filled(template, {1: [2, 3, 4], 2: [5, 6, 7]})
    tree = d.propose(torch.tensor([1]))
    assert tree.tokens.tolist() == [2, 3, 5, 7]
    assert tree.parents == (-1, -1, 0, 0)
    # Now the rank-0 child (token 2) is unknown: its whole subtree goes, node 1 stays and its
    # child is renumbered below it.
    d = _hand_filled(template, {1: [2, 3, 4], 3: [8, 9, 0]})
    tree = d.propose(torch.tensor([1]))
    assert tree.tokens.tolist() == [2, 3, 8]
    assert tree.parents == (-1, -1, 1)


def test_unknown_root_gives_empty_tree() -> None:
    d = _hand_filled({"parents": [-1, 0]}, {1: [2, 3, 4]})
    assert len(d.propose(torch.tensor([7]))) == 0
    assert len(TokenRecycleDrafter().propose(torch.tensor([7]))) == 0  # no table yet


def test_expansion_of_builtin_15_node_template() -> None:
    # Every token's candidates are (t+1, t+2, t+3, t+4) mod V: a fully known table.
    rows = {t: [(t + j) % V for j in range(1, 5)] for t in range(V)}
    d = TokenRecycleDrafter("builtin:token_recycle_15.json", top_k=4)
    d.table = AdjacencyTable(V, 4)
    for t, c in rows.items():
        d.table.candidates[t] = torch.tensor(c)
    d.table.filled[:] = True
    tree = d.propose(torch.tensor([0]))
    assert len(tree) == 15
    assert tree.parents == (-1, 0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7)
    # node 0 = 1; its children 2,3,4,5; their first two children; then rank-0 below 5 and 7.
    assert tree.tokens.tolist() == [1, 2, 3, 4, 5, 3, 4, 4, 5, 5, 6, 6, 7, 4, 5]


def test_keep_table_false_starts_every_request_cold() -> None:
    d = TokenRecycleDrafter({"parents": [-1]}, top_k=1, keep_table=False)
    d.prefill_feedback(torch.tensor([2]), logits_ranking(3)[None], torch.zeros(1, 2))
    assert len(d.propose(torch.tensor([2]))) == 1
    d.reset(torch.tensor([2]))
    assert len(d.propose(torch.tensor([2]))) == 0
    warm = TokenRecycleDrafter({"parents": [-1]}, top_k=1)
    warm.prefill_feedback(torch.tensor([2]), logits_ranking(3)[None], torch.zeros(1, 2))
    warm.reset(torch.tensor([2]))
    assert len(warm.propose(torch.tensor([2]))) == 1


# ----------------------------------------------------------------------------- templates
def test_builtin_15_node_template_matches_the_issue() -> None:
    t = load_template("builtin:token_recycle_15.json")
    assert len(t) == 15 and t.level_sizes() == [1, 4, 8, 2]
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(t.parents):
        kids.setdefault(p, []).append(i)
    assert kids == {
        -1: [0],
        0: [1, 2, 3, 4],
        1: [5, 6],
        2: [7, 8],
        3: [9, 10],
        4: [11, 12],
        5: [13],
        7: [14],
    }
    assert t.ranks == (0, 0, 1, 2, 3, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0)


def test_builtin_large_template_shape() -> None:
    t = load_template("builtin:token_recycle_large.json")
    assert 60 <= len(t) <= 80 and 5 <= t.max_depth <= 6
    sizes = t.level_sizes()
    assert sizes[0] == 8 and sizes[1] > sizes[0]  # wide near the root
    assert t.max_rank < 8

    def descendants(i: int) -> int:
        kids = [j for j, p in enumerate(t.parents) if p == i]
        return len(kids) + sum(descendants(j) for j in kids)

    roots = sorted((t.ranks[i], descendants(i)) for i, p in enumerate(t.parents) if p == -1)
    counts = [c for _, c in roots]
    assert (
        counts == sorted(counts, reverse=True) and counts[0] > counts[1] > 0
    )  # top ranks get more
    # The shipped JSON is exactly what its documented build script produces.
    root = Path(__file__).resolve().parents[3]
    built = subprocess.run(
        [sys.executable, str(root / "scripts/build_tree_template.py"), "--check"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr


def test_builtin_listing() -> None:
    assert builtin_templates() == ["token_recycle_15.json", "token_recycle_large.json"]


def test_ranks_default_to_sibling_order() -> None:
    t = load_template({"parents": [-1, -1, 0, 0, 0]})
    assert t.ranks == (0, 1, 0, 1, 2)


@pytest.mark.parametrize(
    "data,match",
    [
        ({"parents": [-1, 0, 3]}, "node 2 has parent 3, which is not a node \\(missing parent\\)"),
        ({"parents": [-1, -2]}, "node 1 has parent -2, which is not a node"),
        ({"parents": [-1, 2, 1]}, "node 1 is on a cycle"),
        ({"parents": [-1, 1]}, "node 1 is its own parent"),
        ({"parents": [-1, 2, 0]}, "node 1 has parent 2, listed after it \\(parent after child\\)"),
        (
            {"parents": [-1, 0, 0], "ranks": [0, 1, 1]},
            "node 2 takes rank 1 of parent 0, already taken by node 1",
        ),
        ({"parents": [-1, 0], "ranks": [0]}, "2 parents but 1 ranks"),
        ({"parents": [-1, 0], "ranks": [0, -1]}, "node 1 has rank -1"),
        ({"parents": [-1, "0"]}, "node 1 has parent '0'"),
        ({"ranks": [0]}, "no 'parents' list"),
    ],
)
def test_template_validation_names_the_node(data: dict, match: str) -> None:
    with pytest.raises(TemplateError, match=match):
        load_template(data)


def test_template_node_budget_and_top_k() -> None:
    with pytest.raises(TemplateError, match="15 nodes exceed the budget of 10"):
        load_template("builtin:token_recycle_15.json", max_nodes=10)
    with pytest.raises(
        TemplateError,
        match="node 3 takes rank 2 but the table keeps only top_k=2 candidates; raise top_k to at least 4",
    ):
        TokenRecycleDrafter("builtin:token_recycle_15.json", top_k=2)
    with pytest.raises(TemplateError, match="15 nodes exceed the budget of 14"):
        TokenRecycleDrafter("builtin:token_recycle_15.json", max_nodes=14)


def test_template_sources(tmp_path: Path) -> None:
    with pytest.raises(
        TemplateError,
        match="no builtin tree template 'nope.json'; available: token_recycle_15.json",
    ):
        load_template("builtin:nope.json")
    with pytest.raises(TemplateError, match="not found"):
        load_template(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TemplateError, match="bad.json is not valid JSON"):
        load_template(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"name": "mine", "parents": [-1, 0, 0]}))
    t = load_template(str(good))
    assert t == TreeTemplate(parents=(-1, 0, 0), ranks=(0, 0, 1), name="mine")
    with pytest.raises(TemplateError, match="node 1 is its own parent"):
        TreeTemplate(parents=(-1, 1), ranks=(0, 0))
