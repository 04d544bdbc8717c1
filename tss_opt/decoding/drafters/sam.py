"""SAM decoding: retrieve the continuation of the longest earlier match with a suffix automaton.

Hu et al. 2024, "SAM Decoding: Speculative Decoding via Suffix Automaton" (arXiv 2411.10666).
A suffix automaton over prompt + output, extended token by token, tracks the longest suffix of
the text that also occurred *ending earlier*, and where. When that match is long enough, its
continuation is proposed as a chain (confidence, for ``drafter=routed``: ``l / (l + 1)`` for a
match of ``l`` tokens, as prompt lookup's heuristic); otherwise an auxiliary drafter (Token Recycling: "SAMD
Token Recycle", the TSS paper's Llama-2-13B setting) proposes a tree. Unlike prompt lookup's
fixed n-grams, the match length is unbounded and each step costs amortised O(1).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tss_opt.config.drafters import DrafterConfigError
from tss_opt.decoding.drafter import Drafter, DrafterCapabilities, NoDrafter, VerifyFeedback
from tss_opt.decoding.drafters.building import builds, fixed_size, need_target
from tss_opt.decoding.drafters.token_recycle import TokenRecycleDrafter
from tss_opt.decoding.sizing import AUTO, COPY_CHAIN_PRIOR, ContextSized, OnlineChain, load_profile
from tss_opt.decoding.tree import DraftTree

if TYPE_CHECKING:
    from tss_opt.decoding.target import TargetModel
    from tss_opt.models.loading import LoadedModel


class SuffixAutomaton:
    """Online suffix automaton over token ids with a running longest-earlier-match.

    After :meth:`extend` has consumed ``s[0..n]``:

    * :attr:`match_length` is the length ``l`` of the longest suffix of ``s[0..n]`` that also
      occurs ending at some position ``e < n``;
    * :attr:`match_end` is the most recent such ``e`` (``-1`` when ``l == 0``), so
      ``s[e + 1 :]`` is what followed the earlier occurrence: the draft.

    States keep the usual ``next``/``link``/``length`` plus ``last_end``, the latest end
    position of the state's strings; it is refreshed along the new state's suffix-link path
    on every extension (every suffix of the text ends at the new position).
    """

    def __init__(self, tokens: Iterable[int] = ()) -> None:
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.last_end: list[int] = [-1]
        self.tokens: list[int] = []
        self._last = 0  # state of the whole text
        self._cur = 0  # state of the current match (strings occurring ending earlier)
        self.match_length = 0
        self.match_end = -1
        self.extend_many(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def continuation(self, max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` tokens that followed the earlier occurrence of the match."""
        if self.match_length == 0:
            return []
        start = self.match_end + 1
        return self.tokens[start : start + max_tokens]

    def extend_many(self, tokens: Iterable[int]) -> None:
        for t in tokens:
            self.extend(int(t))

    def extend(self, token: int) -> None:
        """Append ``token`` (position ``n = len(self)``) and update the running match."""
        n = len(self.tokens)
        nxt, link, length, last_end = self.next, self.link, self.length, self.last_end

        # 1) Match against the automaton of s[0..n-1] (before adding the token), so every
        #    occurrence found ends before n and has a non-empty continuation.
        st, ln = self._cur, self.match_length
        while st != 0 and token not in nxt[st]:
            st = link[st]
            ln = length[st]
        if token in nxt[st]:
            st = nxt[st][token]
            ln += 1
        else:
            st, ln = 0, 0
        self.match_length = ln
        self.match_end = last_end[st] if ln > 0 else -1

        # 2) Standard online extension (Blumer et al.).
        cur = len(length)
        nxt.append({})
        link.append(0)
        length.append(length[self._last] + 1)
        last_end.append(n)
        p = self._last
        while p != -1 and token not in nxt[p]:
            nxt[p][token] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = len(length)
                nxt.append(dict(nxt[q]))
                link.append(link[q])
                length.append(length[p] + 1)
                last_end.append(last_end[q])
                while p != -1 and nxt[p].get(token) == q:
                    nxt[p][token] = clone
                    p = link[p]
                link[q] = clone
                link[cur] = clone
        self._last = cur
        # Every suffix of s[0..n] now ends at n: refresh last_end along cur's suffix links.
        v = cur
        while v > 0:
            last_end[v] = n
            v = link[v]
        self.tokens.append(token)

        # 3) If the match state was split by a clone, the matched string (length ln) may now
        #    belong to the clone, which became the state's suffix link.
        if st != 0 and ln <= length[link[st]]:
            st = link[st]
        self._cur = st


class SamdDrafter(Drafter):
    """SAM decoding with an auxiliary tree drafter ("SAMD Token Recycle").

    Args:
        threshold: minimum match length for the retrieved chain to be used (SAM-Decoding's
            ``len_threshold``, 4 in its reference settings).
        num_tokens: chain length proposed from a match (its ``n_predicts``, 10).
        fallback: drafter used when the match is shorter; default a
            :class:`TokenRecycleDrafter` with the builtin 15-node template.
        sizer: the match chain's length per context length, overriding ``num_tokens``
            (``num_tokens=auto``, :func:`sized_match_chain`); where it is 0 the fallback drafts.
        online: the match chain's length per step from this request's own acceptance of
            match chains, overriding ``sizer`` (``adapt: true``,
            :class:`~tss_opt.decoding.sizing.online.OnlineChain`); where it is 0 the fallback drafts.

    The automaton is rebuilt per request from the prompt and extended with the committed
    tokens (it catches up from ``context`` in :meth:`propose`, which holds exactly prompt +
    committed tokens, so it can never drift from what the engine committed). The fallback
    learns from every verification, whichever drafter proposed the tree.
    """

    # The match chain copies from the context, like prompt lookup (a match of at least
    # ``threshold`` tokens makes it likelier to hold: a measured profile-samd.json says how much).
    sizing_prior = COPY_CHAIN_PRIOR

    def __init__(
        self, threshold: int = 4, num_tokens: int = 10, fallback: Drafter | None = None,
        sizer: ContextSized | None = None, online: OnlineChain | None = None,
    ) -> None:
        if threshold < 1 or num_tokens < 1:
            raise ValueError(
                f"SAM decoding needs threshold >= 1 and num_tokens >= 1; got threshold={threshold}, num_tokens={num_tokens}"
            )
        self.threshold = threshold
        self.num_tokens = num_tokens
        self.sizer = sizer
        self.online = online
        self.fallback: Drafter = fallback if fallback is not None else TokenRecycleDrafter()
        # What SAMD can do is what its fallback can (the automaton itself needs nothing).
        fb = self.fallback.capabilities
        name = "Token Recycling" if isinstance(self.fallback, TokenRecycleDrafter) else type(self.fallback).__name__
        self.capabilities = DrafterCapabilities(
            prefill_feedback=fb.prefill_feedback,
            confidence=fb.confidence,
            replayable=fb.replayable,
            replay_refusal=(
                f"evaluator=replay cannot reproduce SAMD's {name} fallback (it learns from target logits "
                "at rejected tree nodes); set +drafter.fallback=none for SAM decoding alone, or use evaluator=engine"
            ),
        )
        self.sam = SuffixAutomaton()
        self.sam_steps = 0  # proposals taken from the automaton
        self.fallback_steps = 0  # proposals taken from the fallback

    def reset(self, prompt_ids: torch.Tensor) -> None:
        self.sam = SuffixAutomaton(prompt_ids.reshape(-1).tolist())
        self.fallback.reset(prompt_ids)
        if self.online is not None:
            self.online.reset()

    def prefill_feedback(
        self, prompt_ids: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor
    ) -> None:
        self.fallback.prefill_feedback(prompt_ids, logits, hidden)

    def update(self, feedback: VerifyFeedback) -> None:
        self.fallback.update(feedback)

    def _sync(self, context: torch.Tensor) -> None:
        n = len(self.sam)
        if int(context.numel()) < n:  # a new request without reset: start over
            self.sam = SuffixAutomaton()
            n = 0
        self.sam.extend_many(context[n:].tolist())

    def propose(self, context: torch.Tensor) -> DraftTree:
        self._sync(context)
        if self.online is not None:
            # Every match chain is scored at full length, drafted or not (sizing/online.py).
            full = self.sam.continuation(self.online.max_tokens) if self.sam.match_length >= self.threshold else []
            cont = full[: self.online.length(context, full)]
        else:
            num_tokens = self.num_tokens if self.sizer is None else self.sizer(int(context.numel()))
            cont = self.sam.continuation(num_tokens) if num_tokens and self.sam.match_length >= self.threshold else []
        if cont:
            self.sam_steps += 1
            ln = self.sam.match_length
            conf = torch.full((len(cont),), ln / (ln + 1), dtype=torch.float32)
            return DraftTree.chain(cont, confidence=conf)
        self.fallback_steps += 1
        return self.fallback.propose(context)


def sized_match_chain(
    target: TargetModel, *, max_tokens: int = 10, directory: str | Path | None = None
) -> ContextSized:
    """``num_tokens=auto``: per context bucket, the match-chain length ``0..max_tokens`` that
    maximises expected tokens per second (the ``samd`` profile, else
    :attr:`SamdDrafter.sizing_prior`)."""
    accept = load_profile("samd", SamdDrafter.sizing_prior, directory)
    return ContextSized.chain(target, accept, max_tokens=max_tokens, directory=directory)


def adapted_match_chain(
    target: TargetModel, *, max_tokens: int = 10, directory: str | Path | None = None
) -> OnlineChain:
    """``num_tokens=auto`` with ``adapt: true``: the match-chain length ``0..max_tokens`` per
    step from the request's own acceptance of match chains, the ``samd`` profile (else
    :attr:`SamdDrafter.sizing_prior`) as the prior."""
    accept = load_profile("samd", SamdDrafter.sizing_prior, directory)
    return OnlineChain.for_target(target, accept, max_tokens=max_tokens, directory=directory)


@builds(SamdDrafter)
def build_samd(
    target: TargetModel,
    loaded: LoadedModel,
    *,
    threshold: int,
    num_tokens: int | str,
    max_tokens: int,
    template: Any,
    top_k: int,
    keep_table: bool,
    fallback: str = "token_recycle",
    adapt: bool = True,
) -> Drafter:
    """SAM decoding with a Token Recycling fallback ("SAMD Token Recycle"). ``num_tokens=auto``
    (the default) sizes the match chain per context length (``0..max_tokens``), ``template=auto``
    the fallback's tree; integers and templates fix them. ``fallback="none"`` (not in the
    shipped file: ``+drafter.fallback=none``) proposes nothing when the match is short (SAM
    decoding alone, replayable by evaluator=replay). ``adapt=True`` (with ``num_tokens=auto``)
    chooses the match chain's length at every step from the request's own acceptance
    (:func:`adapted_match_chain`) and, with ``template=auto``, gates the fallback's steps on it
    too (:meth:`TokenRecycleDrafter.sized_to`)."""
    if fallback not in ("none", "token_recycle"):
        raise DrafterConfigError(
            f"drafter samd: fallback={fallback!r} is not a fallback; expected token_recycle or none"
        )
    if num_tokens == AUTO:
        need_target("samd", "num_tokens", target)
    if template == AUTO and fallback != "none":  # without a fallback there is no tree to size
        need_target("samd", "template", target)
    if not isinstance(adapt, bool):
        raise DrafterConfigError(f"drafter 'samd': adapt={adapt!r}; expected true or false (docs/drafters.md, 'Adapted per request')")
    most = fixed_size("samd", "max_tokens", max_tokens)
    online = adapted_match_chain(target, max_tokens=most) if num_tokens == AUTO and adapt else None
    sizer = sized_match_chain(target, max_tokens=most) if num_tokens == AUTO and online is None else None
    aux: Drafter
    if fallback == "none":
        aux = NoDrafter()
    elif template == AUTO:
        aux = TokenRecycleDrafter.sized_to(target, top_k=top_k, keep_table=keep_table, adapt=adapt)
    else:
        aux = TokenRecycleDrafter(template=template, top_k=top_k, keep_table=keep_table)
    fixed = most if num_tokens == AUTO else fixed_size("samd", "num_tokens", num_tokens)
    return SamdDrafter(threshold=threshold, num_tokens=fixed, fallback=aux, sizer=sizer, online=online)
