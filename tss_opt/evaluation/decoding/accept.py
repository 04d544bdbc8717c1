"""Acceptance rules: which drafted nodes the target keeps, and its own next token.

Greedy verification keeps the longest root-to-leaf path whose tokens equal the target's
argmax at every step, then adds the target's token after it (the bonus/correction). With
temperature > 0, speculative sampling (Leviathan et al. 2023; Chen et al. 2023) keeps the
target's distribution exactly.
"""

from __future__ import annotations

import torch

from tss_opt.evaluation.decoding.tree import DraftTree


def sample_token(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """Greedy (temperature 0) or a draw from ``softmax(logits / T)``.

    Args:
        logits: ``torch.FloatTensor`` of shape ``(vocab,)``.
    """
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


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
    accepted: list[int] = []
    for i, x in enumerate(tokens):
        if tree.probs is not None:
            q = tree.probs[i].float().to(p.device)
            qx = float(q[x])
        else:
            q, qx = None, 1.0
        px = float(p[i, x])
        u = float(torch.rand((), generator=generator))
        if qx > 0 and u < min(1.0, px / qx):  # p >= q at x: always accept
            accepted.append(i)
            continue
        residual = p[i].clone()
        if q is None:
            residual[x] = 0.0  # max(p - onehot(x), 0)
        else:
            residual = (residual - q).clamp_min_(0.0)
        total = float(residual.sum())
        if total <= 0:  # p == q: rejection has probability 0; guard float round-off
            residual = p[i]
        bonus = int(torch.multinomial(residual, 1, generator=generator))
        return accepted, [tokens[j] for j in accepted] + [bonus]
    bonus = int(torch.multinomial(p[len(tokens)], 1, generator=generator))
    return accepted, tokens + [bonus]
