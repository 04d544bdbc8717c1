"""TAPS: combine several drafters by confidence routing or by one merged tree (lossless).

Task-aware drafting (TAPS, see docs/drafters.md) holds several member drafters (any
configured ones: prompt lookup, Token Recycling, SAMD, EAGLE heads, draft models). Every
member proposes a tree at every step; then

- :class:`RoutedDrafter` (``drafter=routed``) verifies the tree of the member with the
  highest mean node confidence (``DraftTree.confidence``; ties go to the member listed first);
- :class:`MergedDrafter` (``drafter=merged``) merges all trees under the shared root into one
  trie (children with the same token below the same parent become one node) and verifies it
  in one target pass. The engine's tree mask is built from parent links, so every node
  attends only to the prefix, its ancestors and itself: no subtree sees another, and position
  ids are prefix length + depth. Greedy acceptance walks the merged tree, so the output is
  still exactly plain greedy decoding of the target.

Feedback: every member's state stays current, whichever tree was verified.

- routed: every member (routed to or not) gets the step's :class:`VerifyFeedback` as the engine
  built it: the verified (routed) tree, its accepted path, the committed tokens and the target's
  logits/hidden rows of that tree. That is what each shipped drafter learns from (Token
  Recycling: the rows' top-k; EAGLE: the accepted path's hidden states; prompt lookup, SAMD's
  automaton and draft models: the committed context), so a member must not assume that
  ``feedback.tree`` is its own proposal.
- merged: each member gets feedback mapped back to its own tree: ``tree`` is the member's
  tree, ``accepted`` its nodes on the accepted path, ``logits``/``hidden`` the merged rows of
  its nodes. Where the accepted path leaves the member's subtree (or the member proposed
  nothing), the remaining accepted nodes are appended to its tree as a chain below its last
  accepted node, so ``accepted`` always covers every accepted token (EAGLE needs the features
  of every committed token).

Statistics per member (:meth:`TapsDrafter.member_stats`): ``routed`` (steps its tree was
verified: chosen by routing, or non-empty and part of the merged tree), ``proposed`` (nodes of
its verified trees), ``accepted`` (accepted draft tokens credited to it; a node several members
proposed is credited to the first of them in ``members`` order, so the members' ``accepted``
add up to the total), and acceptance by depth (``depth_verified[d - 1]``: steps whose verified
tree of this member reached depth ``d``; ``depth_accepted[d - 1]``: steps whose accepted path
reached depth ``d`` inside its tree).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from tss_opt.config.drafters import DrafterConfigError
from tss_opt.decoding.budget import prune_depth
from tss_opt.decoding.drafter import Drafter, DrafterCapabilities, VerifyFeedback
from tss_opt.decoding.drafters.building import WeightCache, builds
from tss_opt.decoding.drafters.registry import build_drafter
from tss_opt.decoding.tree import ROOT, DraftTree

if TYPE_CHECKING:
    from tss_opt.decoding.target import TargetModel
    from tss_opt.models.loading import LoadedModel


@dataclass
class MemberStats:
    """What one member contributed (see the module docstring for the definitions)."""

    name: str
    routed: int = 0
    proposed: int = 0
    accepted: int = 0
    depth_verified: list[int] = field(default_factory=list)
    depth_accepted: list[int] = field(default_factory=list)

    @property
    def acceptance_by_depth(self) -> list[float]:
        """``[d - 1]``: share of the verified trees reaching depth ``d`` whose accepted path
        reached depth ``d`` inside this member's tree."""
        return [a / v if v else 0.0 for a, v in zip(self.depth_accepted, self.depth_verified, strict=True)]

    def record(self, depth: int, accepted_depth: int) -> None:
        """Count one verified tree of maximum ``depth`` whose accepted path reached ``accepted_depth``."""
        grow = max(depth, accepted_depth) - len(self.depth_verified)
        if grow > 0:
            self.depth_verified.extend([0] * grow)
            self.depth_accepted.extend([0] * grow)
        for d in range(depth):
            self.depth_verified[d] += 1
        for d in range(accepted_depth):
            self.depth_accepted[d] += 1

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["acceptance_by_depth"] = self.acceptance_by_depth
        return d


class TapsDrafter(Drafter):
    """Shared part of :class:`RoutedDrafter` and :class:`MergedDrafter`: the members, their
    reset/prefill feedback and the statistics.

    Args:
        members: ``(name, drafter)`` pairs, in priority order; names must be distinct.
    """

    def __init__(self, members: Sequence[tuple[str, Drafter]]) -> None:
        if not members:
            raise DrafterConfigError(
                "a TAPS drafter needs members: give drafter.members, e.g. [{name: pld}, {name: token_recycle}]"
            )
        names = [n for n, _ in members]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise DrafterConfigError(
                f"TAPS member name(s) {', '.join(dup)} used more than once; give each a distinct 'label'"
            )
        self.members: list[tuple[str, Drafter]] = list(members)
        self.capabilities = DrafterCapabilities(
            prefill_feedback=any(d.capabilities.prefill_feedback for _, d in members),
            confidence=all(d.capabilities.confidence for _, d in members),
        )
        self._max_depth: int | None = None  # the engine's budget for the step being proposed
        self.reset_stats()

    def reset_stats(self) -> None:
        """Zero the statistics (they accumulate over requests until then)."""
        self.stats = [MemberStats(name) for name, _ in self.members]
        self.steps = 0
        self.total_accepted = 0
        self.empty_steps = 0  # steps where no member proposed anything

    def member_stats(self) -> dict[str, dict[str, Any]]:
        """Per member: ``routed``, ``proposed``, ``accepted``, ``depth_verified``,
        ``depth_accepted`` and ``acceptance_by_depth`` (accumulated since :meth:`reset_stats`)."""
        return {s.name: s.to_dict() for s in self.stats}

    def reset(self, prompt_ids: torch.Tensor) -> None:
        for _, d in self.members:
            d.reset(prompt_ids)

    def prefill_feedback(self, prompt_ids: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor) -> None:
        for _, d in self.members:
            if d.capabilities.prefill_feedback:
                d.prefill_feedback(prompt_ids, logits, hidden)

    def propose_within(self, context: torch.Tensor, max_depth: int) -> DraftTree:
        """Each member drafts within the budget before routing or merging, so that the
        verified tree is the one whose node maps the feedback goes back through."""
        self._max_depth = max_depth
        try:
            return self.propose(context)
        finally:
            self._max_depth = None

    def _propose_all(self, context: torch.Tensor) -> list[DraftTree]:
        limit = self._max_depth
        return [d.propose(context) if limit is None else d.propose_within(context, limit) for _, d in self.members]


def mean_confidence(name: str, tree: DraftTree) -> float:
    """The routing score of a member's tree: the mean of its node confidences (``-1`` for an
    empty tree, so any proposal beats none).

    Raises:
        DrafterConfigError: the tree has nodes but no confidences.
    """
    if len(tree) == 0:
        return -1.0
    if tree.confidence is None:
        raise DrafterConfigError(
            f"TAPS member {name!r} proposed a tree without confidences (DraftTree.confidence); "
            "drafter=routed needs them: use drafter=merged or a member that sets them"
        )
    return float(tree.confidence.float().mean())


class RoutedDrafter(TapsDrafter):
    """Verifies, per step, the member tree with the highest mean node confidence.

    Raises:
        DrafterConfigError: a member that gives no confidences (``capabilities.confidence`` false),
            named in the message.
    """

    def __init__(self, members: Sequence[tuple[str, Drafter]]) -> None:
        without = [f"{n!r} ({type(d).__name__})" for n, d in members if not d.capabilities.confidence]
        if without:
            raise DrafterConfigError(
                f"drafter=routed needs per-node confidences, but member(s) {', '.join(without)} give none; "
                "use members that do (pld, token_recycle, samd, eagle, draft_model, self) or drafter=merged"
            )
        super().__init__(members)
        self._chosen: int | None = None  # the member whose tree is being verified

    def propose(self, context: torch.Tensor) -> DraftTree:
        trees = self._propose_all(context)
        scores = [mean_confidence(n, t) for (n, _), t in zip(self.members, trees, strict=True)]
        best = max(range(len(trees)), key=lambda i: (scores[i], -i))  # ties: the first member
        if len(trees[best]) == 0:
            self._chosen = None
            return DraftTree.empty()
        self._chosen = best
        return trees[best]

    def update(self, feedback: VerifyFeedback) -> None:
        self.steps += 1
        n_acc = len(feedback.accepted)
        self.total_accepted += n_acc
        if self._chosen is None or len(feedback.tree) == 0:  # nothing verified (or cut to the budget)
            self.empty_steps += 1
        else:
            s = self.stats[self._chosen]
            s.routed += 1
            s.proposed += len(feedback.tree)
            s.accepted += n_acc
            s.record(max(feedback.tree.depth, default=0), n_acc)
        self._chosen = None
        for _, d in self.members:
            d.update(feedback)


# ----------------------------------------------------------------------------- merging
@dataclass(frozen=True)
class MergedTree:
    """Member trees merged into one trie under the shared root.

    Attributes:
        tree: the merged :class:`DraftTree` (parents first; ``confidence`` is the highest of
            the members' confidences of a node when every non-empty member gives them).
        node_maps: ``node_maps[m][i]``: the merged node of member ``m``'s node ``i``.
        owners: ``owners[j]``: the members that proposed merged node ``j``, in member order.
    """

    tree: DraftTree
    node_maps: tuple[tuple[int, ...], ...]
    owners: tuple[tuple[int, ...], ...]

    @property
    def deduplicated(self) -> int:
        """Member nodes that were folded into an existing node."""
        return sum(len(m) for m in self.node_maps) - len(self.tree)


def merge_trees(trees: Sequence[DraftTree]) -> MergedTree:
    """Merge draft trees under one root, deduplicating identical paths (a trie merge).

    A node becomes the existing merged node with the same token below the same merged parent,
    else a new node appended after its parent, so the result is in topological order. Draft
    distributions (``probs``) are dropped: the merged tree is verified as a deterministic
    draft (greedy, or the coupled rule with temperature > 0, which is exact for any tree).

    Args:
        trees: the members' trees, in member order.
    """
    index: dict[tuple[int, int], int] = {}
    tokens: list[int] = []
    parents: list[int] = []
    conf: list[float] = []
    owners: list[list[int]] = []
    maps: list[tuple[int, ...]] = []
    with_conf = all(t.confidence is not None for t in trees if len(t))
    for m, t in enumerate(trees):
        toks = t.tokens.tolist()
        cs = t.confidence.tolist() if t.confidence is not None else [0.0] * len(toks)
        mp: list[int] = []
        for i, p in enumerate(t.parents):
            mpar = ROOT if p == ROOT else mp[p]
            key = (mpar, toks[i])
            j = index.get(key)
            if j is None:
                j = len(tokens)
                index[key] = j
                tokens.append(toks[i])
                parents.append(mpar)
                conf.append(cs[i])
                owners.append([m])
            else:
                if owners[j][-1] != m:
                    owners[j].append(m)
                conf[j] = max(conf[j], cs[i])
            mp.append(j)
        maps.append(tuple(mp))
    tree = DraftTree(
        tokens=torch.tensor(tokens, dtype=torch.long),
        parents=tuple(parents),
        confidence=torch.tensor(conf, dtype=torch.float32) if with_conf else None,
    )
    return MergedTree(tree=tree, node_maps=tuple(maps), owners=tuple(tuple(o) for o in owners))


def accepted_inside(accepted: Sequence[int], node_map: Sequence[int], own: DraftTree) -> list[int]:
    """The member's nodes along the merged tree's accepted path, root to leaf, up to where
    the path leaves the member's tree.

    Args:
        accepted: accepted merged nodes, root to leaf.
        node_map: the member's ``MergedTree.node_maps`` entry.
        own: the member's tree.
    """
    kids = own.children()
    inside: list[int] = []
    row = 0  # 0 = root, i + 1 = member node i
    for j in accepted:
        nxt = next((c for c in kids[row] if node_map[c] == j), None)
        if nxt is None:
            break
        inside.append(nxt)
        row = nxt + 1
    return inside


def member_feedback(
    feedback: VerifyFeedback, merged: MergedTree, member: int, own: DraftTree
) -> VerifyFeedback:
    """Map the merged tree's feedback back to one member's tree: its tree, extended by the
    accepted nodes outside it as a chain below its last accepted node; ``accepted`` covers
    every accepted token; ``logits``/``hidden`` rows are ``[root, its nodes..., the extension]``.
    """
    mp = merged.node_maps[member]
    inside = accepted_inside(feedback.accepted, mp, own)
    outside = list(feedback.accepted[len(inside) :])
    if not outside and len(own) == len(merged.tree) and list(mp) == list(range(len(own))):
        return feedback  # the merged tree is this member's tree
    n = len(own)
    tail_parent = inside[-1] if inside else ROOT
    ext_parents = [tail_parent if k == 0 else n + k - 1 for k in range(len(outside))]
    tokens = torch.cat([own.tokens.cpu(), merged.tree.tokens[outside]]) if outside else own.tokens
    tree = DraftTree(tokens=tokens, parents=tuple(own.parents) + tuple(ext_parents))
    rows = torch.tensor([0, *(j + 1 for j in mp), *(j + 1 for j in outside)], dtype=torch.long)
    rows = rows.to(feedback.logits.device)
    fb = VerifyFeedback(
        tree=tree,
        accepted=tuple(inside) + tuple(range(n, n + len(outside))),
        committed=feedback.committed,
        logits=feedback.logits[rows],
        hidden=feedback.hidden[rows.to(feedback.hidden.device)],
        root_token=feedback.root_token,
    )
    return fb


def _learns(d: Drafter) -> bool:
    """Whether ``d`` overrides :meth:`Drafter.update` (else its feedback need not be built)."""
    return type(d).update is not Drafter.update


class MergedDrafter(TapsDrafter):
    """Verifies the trie merge of every member's tree in one target pass."""

    def __init__(self, members: Sequence[tuple[str, Drafter]]) -> None:
        super().__init__(members)
        self._trees: list[DraftTree] | None = None
        self._merged: MergedTree | None = None

    def reset_stats(self) -> None:
        super().reset_stats()
        self.deduplicated = 0  # member nodes folded into another member's identical path

    def propose(self, context: torch.Tensor) -> DraftTree:
        self._trees = self._propose_all(context)
        self._merged = merge_trees(self._trees)
        self.deduplicated += self._merged.deduplicated
        return self._merged.tree

    def update(self, feedback: VerifyFeedback) -> None:
        trees, merged = self._trees, self._merged
        self._trees, self._merged = None, None
        if trees is None or merged is None:  # not driven by propose (e.g. a replay): pass through
            for _, d in self.members:
                d.update(feedback)
            return
        if len(feedback.tree) != len(merged.tree):
            # The engine verified the merge cut to its budget (a wrapper's propose_within pruned
            # it): cut the members alike. Merging keeps first-appearance order, so merging the
            # cut members gives exactly the cut merge, and the node maps stay right.
            limit = max(feedback.tree.depth, default=0)
            trees = [prune_depth(t, limit) for t in trees]
            merged = merge_trees(trees)
            assert merged.tree.parents == feedback.tree.parents
        self.steps += 1
        self.total_accepted += len(feedback.accepted)
        if len(merged.tree) == 0:
            self.empty_steps += 1
        for j in feedback.accepted:  # credit each accepted node to its first proposer
            self.stats[merged.owners[j][0]].accepted += 1
        for m, ((_, d), own) in enumerate(zip(self.members, trees, strict=True)):
            s = self.stats[m]
            if len(own):
                reached = len(accepted_inside(feedback.accepted, merged.node_maps[m], own))
                s.routed += 1
                s.proposed += len(own)
                s.record(max(own.depth), reached)
            if _learns(d):
                d.update(member_feedback(feedback, merged, m, own))


def format_member_stats(drafter: TapsDrafter, max_depth: int = 6) -> str:
    """A few lines of per-member statistics for the command line."""
    extra = f", {drafter.deduplicated} deduplicated nodes" if isinstance(drafter, MergedDrafter) else ""
    lines = [
        f"TAPS members: {drafter.steps} steps, {drafter.total_accepted} accepted draft tokens, "
        f"{drafter.empty_steps} empty steps{extra}"
    ]
    for s in drafter.stats:
        by_depth = ", ".join(f"{a:.2f}" for a in s.acceptance_by_depth[:max_depth])
        lines.append(
            f"  {s.name}: routed {s.routed}, proposed {s.proposed}, accepted {s.accepted}, "
            f"acceptance by depth [{by_depth}]"
        )
    return "\n".join(lines)


def _build_members(
    kind: str, members: Any, target: TargetModel, loaded: LoadedModel, weights: WeightCache | None
) -> list[tuple[str, Drafter]]:
    """Build TAPS members: each entry a drafter config (``name`` + settings, optional
    ``label`` naming it in statistics; default its ``name``)."""
    if not members or isinstance(members, (str, Mapping)):
        raise DrafterConfigError(
            f"drafter {kind!r} needs drafter.members: a list of drafter configs, e.g. "
            "[{name: pld}, {name: token_recycle}]; got " + repr(members)
        )
    out: list[tuple[str, Drafter]] = []
    for i, m in enumerate(members):
        plain = dict(m) if not isinstance(m, str) else {"name": m}
        if not plain.get("name") and not plain.get("_target_"):
            raise DrafterConfigError(
                f"drafter {kind!r}: member {i} ({plain!r}) has no name; give e.g. {{name: pld}}"
            )
        if plain.get("name") in ("routed", "merged"):
            raise DrafterConfigError(
                f"drafter {kind!r}: member {i} is {plain['name']!r}; TAPS members must be single drafters"
            )
        label = str(plain.pop("label", None) or plain.get("name") or plain["_target_"])
        out.append((label, build_drafter(plain, target, loaded, weights=weights)))
    return out


@builds(RoutedDrafter)
def build_routed(target: TargetModel, loaded: LoadedModel, *, members: Any = None,
                 weights: WeightCache | None = None) -> Drafter:
    """TAPS confidence routing: per step, the member tree with the highest mean confidence."""
    return RoutedDrafter(_build_members("routed", members, target, loaded, weights))


@builds(MergedDrafter)
def build_merged(target: TargetModel, loaded: LoadedModel, *, members: Any = None,
                 weights: WeightCache | None = None) -> Drafter:
    """TAPS merged tree: every member's tree under one root, verified in one pass."""
    return MergedDrafter(_build_members("merged", members, target, loaded, weights))
