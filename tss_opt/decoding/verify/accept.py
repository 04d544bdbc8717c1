"""Acceptance rules: which drafted nodes the target keeps, and its own next token.

Greedy verification keeps the longest root-to-leaf path whose tokens equal the target's
argmax at every step, then adds the target's token after it (the bonus/correction).

With temperature > 0 there are two exact rules:

- :func:`accept_coupled`, for drafters whose proposals are deterministic (no ``probs``: prompt
  lookup, Token Recycling, SAMD, EAGLE's tree, greedy draft models). The target's token at
  output position ``t`` is drawn by a :class:`PositionalSampler` whose randomness depends only
  on ``(seed, t)``; a drafted node is kept when it equals that draw. Kept with probability
  ``p(x)``, else the draw (distributed as the residual ``p`` without ``x``): the same law as
  speculative sampling with a one-hot ``q``, but the output is *exactly* the one plain
  sampling with the same seed gives, whatever was drafted (so a drafter's state, such as a
  Token Recycling table kept across requests, can never change a seeded output). Trees work
  too: the walk follows the child equal to each draw.
- :func:`accept_sampling`, speculative sampling (Leviathan et al. 2023; Chen et al. 2023) for
  chains drafted from a distribution ``q`` (a draft model sampling at temperature > 0), whose
  acceptance ``sum(min(p, q))`` beats the coupled rule's.
"""

from __future__ import annotations

import hashlib

import torch

from tss_opt.decoding.host_syncs import upload
from tss_opt.decoding.tree import DraftTree


class PositionalSampler:
    """Draws the target's token at output position ``t`` from ``softmax(logits / T)`` with
    randomness that depends on ``(seed, t)`` alone (a uniform hashed from both).

    The draw at a position is the same whether that position is reached by plain decoding or
    inside a verified draft, and whatever happened at other positions: speculative decoding
    with :func:`accept_coupled` then reproduces plain sampling token for token.

    Args:
        temperature: > 0.
        seed: the request's seed; ``None`` draws one at random (a fresh request stream).
    """

    def __init__(self, temperature: float, seed: int | None) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature={temperature}; a sampler needs temperature > 0")
        self.temperature = temperature
        self.seed = int(torch.randint(0, 2**62, ()).item()) if seed is None else int(seed)

    def draw(self, logits: torch.Tensor, position: int) -> int:
        """The token at output ``position`` (0 = the first generated token).

        Args:
            logits: ``torch.FloatTensor`` of shape ``(vocab,)``.
        """
        # Inverse-CDF draw with a uniform hashed from (seed, position): independent across
        # positions and seeds, platform independent, and no torch.Generator (whose seeding
        # keeps only 32 bits, which made neighbouring streams collide).
        return self.draw_probs(torch.softmax(logits.double() / self.temperature, dim=-1), position)

    def draw_probs(self, probs: torch.Tensor, position: int) -> int:
        """The token at output ``position`` drawn from ``probs`` (``(vocab,)``, float64), with
        the same uniform as :meth:`draw` (relaxed verification draws from a blend with it)."""
        return self.draw_rows(probs.reshape(1, -1), [position], normalised=True)[0]

    def uniform(self, position: int) -> float:
        """The uniform in ``[0, 1)`` of output ``position``: a hash of ``(seed, position)``."""
        digest = hashlib.blake2b(f"{self.seed}:{position}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64

    def draw_rows(self, rows: torch.Tensor, positions: list[int], normalised: bool = False) -> list[int]:
        """One draw per row, row ``r`` at output ``positions[r]``, with one host read-back.

        Args:
            rows: ``(R, vocab)`` logits (``normalised=False``: softmax at the temperature is
                taken here, in float64) or probabilities (``normalised=True``), on any device.
            positions: ``R`` output positions.

        Returns:
            ``R`` token ids; each equals :meth:`draw` of its row at its position (the uniforms
            come from the host hash and are moved to the rows' device once).
        """
        probs = rows.double() if normalised else torch.softmax(rows.double() / self.temperature, dim=-1)
        cdf = probs.cumsum(-1)  # [R, V]
        u = upload(torch.tensor([self.uniform(t) for t in positions], dtype=torch.float64), cdf.device)
        # The value searched is u times the row's total mass (float round-off: not exactly 1).
        idx = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True)  # [R, 1]
        last = cdf.shape[-1] - 1
        return [min(int(i), last) for i in idx.reshape(-1).tolist()]


def accept_coupled(
    tree: DraftTree, logits: torch.Tensor, sampler: PositionalSampler, position: int
) -> tuple[list[int], list[int]]:
    """Walk the tree along the sampler's draws (deterministic drafts, temperature > 0).

    Args:
        logits: ``torch.FloatTensor`` of shape ``(n + 1, vocab)``, rows ``[root, node_0, ...]``.
        position: output position of the token after the root (the first one this step commits).

    Returns:
        ``(accepted, committed)`` as :func:`accept_greedy`.
    """
    tokens = tree.tokens.tolist()
    kids = tree.children()
    # Row ``r`` predicts the token at position + depth(r): every row's draw in one batch and
    # one read-back (the walk below only looks them up), the same draws as row by row.
    depth = (0, *(d for d in tree.depth))
    draws = sampler.draw_rows(logits, [position + d for d in depth])
    accepted: list[int] = []
    row = 0
    while True:
        want = draws[row]
        nxt = next((c for c in kids[row] if tokens[c] == want), None)
        if nxt is None:
            return accepted, [tokens[i] for i in accepted] + [want]
        accepted.append(nxt)
        row = nxt + 1


def accept_greedy(tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], list[int]]:
    """Walk the tree along the target's argmax choices.

    Args:
        logits: ``torch.FloatTensor`` of shape ``(n + 1, vocab)``, rows ``[root, node_0, ...]``.

    Returns:
        ``(accepted, committed)``: accepted node indices root-to-leaf, and the committed tokens
        (accepted tokens followed by the target's bonus token).
    """
    choice = logits.argmax(dim=-1).tolist()  # [n+1]: the target's token after each slot
    tokens = tree.tokens.tolist()
    kids = tree.children()
    accepted: list[int] = []
    row = 0  # 0 = root, i + 1 = node i
    while True:
        want = choice[row]
        nxt = next((c for c in kids[row] if tokens[c] == want), None)
        if nxt is None:
            break
        accepted.append(nxt)
        row = nxt + 1
    committed = [tokens[i] for i in accepted] + [choice[row]]
    return accepted, committed


def accept_sampling(
    tree: DraftTree, logits: torch.Tensor, temperature: float, generator: torch.Generator | None
) -> tuple[list[int], list[int]]:
    """Speculative sampling over a chain.

    Node ``i`` (token ``x``, drafted from ``q``) is kept with probability
    ``min(1, p(x) / q(x))``; at the first rejection a token is drawn from the normalised
    residual ``max(p - q, 0)``; when all are kept the bonus is drawn from ``p``. A drafter
    without ``probs`` is deterministic: ``q`` is one-hot at ``x``.

    Args:
        logits: ``torch.FloatTensor`` of shape ``(n + 1, vocab)``.
    """
    if not tree.is_chain:
        raise ValueError(
            "speculative sampling (temperature > 0) verifies chains only, but the drafter proposed a "
            "branching tree; use temperature 0 with tree drafters"
        )
    p = torch.softmax(logits.float() / temperature, dim=-1)  # [n+1, V]
    tokens = tree.tokens.tolist()
    n, dev = len(tokens), p.device
    if n == 0:
        return [], [int(torch.multinomial(p[0], 1, generator=generator))]
    # Every node's test in one batch and one read-back (three host reads per node
    # before), with the same uniforms in the same stream order as one node at a time: the
    # uniforms of all n nodes are drawn, the first rejection is found, then the generator is
    # rewound and advanced by exactly the draws the sequential rule makes before its
    # multinomial (so seeded outputs are unchanged).
    x = upload(tree.tokens, dev)[:, None]  # [n, 1]
    px = p[:n].gather(1, x)[:, 0].double()  # [n]
    if tree.probs is not None:
        q_all = tree.probs.float().to(dev)  # [n, V]
        qx = q_all.gather(1, x)[:, 0].double()
    else:
        q_all, qx = None, torch.ones(n, dtype=torch.float64, device=dev)
    state = generator.get_state() if generator is not None else None
    u = torch.stack([torch.rand((), generator=generator, device=dev) for _ in range(n)]).double()
    # p >= q at x: always accept (the ratio is clamped at 1)
    keep = ((qx > 0) & (u < (px / qx).clamp(max=1.0))).tolist()
    j = keep.index(False) if False in keep else n  # the first rejected node
    if generator is not None and state is not None:  # (the default generator is not rewound)
        generator.set_state(state)
        for _ in range(min(j + 1, n)):
            torch.rand((), generator=generator, device=dev)
    accepted = list(range(j))
    if j == n:
        bonus = int(torch.multinomial(p[n], 1, generator=generator))
        return accepted, tokens + [bonus]
    residual = p[j].clone()
    if q_all is None:
        residual[tokens[j]] = 0.0  # max(p - onehot(x), 0)
    else:
        residual = (residual - q_all[j]).clamp_min_(0.0)
    # p == q: rejection has probability 0; guard float round-off (no host read: a device where)
    residual = torch.where(residual.sum() > 0, residual, p[j])
    bonus = int(torch.multinomial(residual, 1, generator=generator))
    return accepted, [tokens[i] for i in accepted] + [bonus]
