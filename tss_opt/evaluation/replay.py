"""The replay evaluator: one batched greedy generation per trial, the drafter replayed on it.

With greedy verification, speculative decoding outputs exactly the (sparse) target's greedy
continuation, and a drafter whose proposals depend only on the context (prompt lookup, SAM
decoding, a draft model, self-drafting) or on the target's features of committed tokens
(EAGLE) proposes the same trees whatever ran the target. So a trial needs only the sparse
target's greedy outputs, computed for many prompts (and skip sets) at once by a
:class:`~tss_opt.decoding.greedy.GreedySource` (by default the batch engine at depth 0:
the model runner the server uses, each row's skipped layers saving its compute), and a replay
of the drafter over each output (:func:`replay_stats`) that walks every proposed tree along
the output, exactly as :func:`~tss_opt.decoding.verify.accept.accept_greedy` walks it along
the target's argmax. Each row of the generation is the computation of its request decoded
alone (its own cache, its own attention; only the linear layers see the other rows' tokens),
so the per-prompt accepted length, tokens and metric equal the engine evaluator's, in float64
and in float32 (tests/evaluation/test_replay.py, the embedded model included). Half precision
rounds differently with the rows' count in the linear layers, so a near-tie can break
differently there (docs/evaluator.md); ``evaluator=auto`` uses the replay in float32/float64.

:class:`ReplayEvaluator` follows the evaluator contract of
:class:`~tss_opt.evaluation.evaluator.SpecDecodeEvaluator` (``per_prompt``, ``num_prompts``,
``prompt_ids=``), so search, early stopping and validation use it unchanged. Only greedy
decoding and the analytic cost are supported: there is no real speculative decoding to time.
Token Recycling (and SAMD with its Token Recycling fallback) is refused: its table learns
from the target's logits at rejected tree nodes, which the replay never computes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

import torch

from tss_opt.decoding.budget import draft_depth_limit, prune_depth
from tss_opt.decoding.drafter import Drafter, NoDrafter, VerifyFeedback
from tss_opt.decoding.engine import SCOPES
from tss_opt.decoding.greedy import BatchGreedy, GreedySource
from tss_opt.decoding.prefill import DensePrefill, dense_prefill
from tss_opt.decoding.protocol import DecodeProtocol
from tss_opt.decoding.stats import DecodeStats
from tss_opt.decoding.target import TargetModel
from tss_opt.errors import TSSError
from tss_opt.evaluation.evaluator import EvalResult, PromptSetEvaluator
from tss_opt.evaluation.prompt_set import PromptSet
from tss_opt.progress import prompts_done

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "ReplayError",
    "ReplayEvaluator",
    "check_replay_protocol",
    "check_replayable",
    "default_batch_size",
    "replay_stats",
]

DEFAULT_BATCH_SIZE = {"cpu": 8, "cuda": 32}
"""Prompts per batched forward when ``evaluator.batch_size`` is null, by device type."""


class ReplayError(TSSError):
    """A setting the replay evaluator cannot reproduce exactly (drafter, cost, temperature)."""


def default_batch_size(device: torch.device | str) -> int:
    """8 on CPU (batching barely pays there), 32 on an accelerator."""
    return DEFAULT_BATCH_SIZE.get(torch.device(device).type, DEFAULT_BATCH_SIZE["cuda"])


# ----------------------------------------------------------------------------- drafters
def check_replayable(drafter: Drafter | None) -> None:
    """Refuse a drafter whose proposals the replay cannot reproduce exactly.

    Replayable: no drafter, and any drafter whose ``capabilities.replayable`` is set (prompt
    lookup, SAM decoding with ``fallback: none``, a draft model, self-drafting, EAGLE): its
    proposals depend only on the context and on the target features of committed tokens;
    :meth:`Drafter.update` then gets feedback whose ``logits`` have no columns.

    Raises:
        ReplayError: naming the drafter and the fix (the drafter's ``replay_refusal``).
    """
    if drafter is None or drafter.capabilities.replayable:
        return
    raise ReplayError(
        drafter.capabilities.replay_refusal
        or f"evaluator=replay does not know whether drafter {type(drafter).__name__} can be replayed; "
        "supported: pld, samd (fallback none), draft_model, self, eagle. Use evaluator=engine, or declare "
        "capabilities = DrafterCapabilities(replayable=True, ...) on the class if its proposals depend only "
        "on the context and target features"
    )


# ----------------------------------------------------------------------------- replay
def replay_stats(
    drafter: Drafter | None,
    prompt: torch.Tensor,
    tokens: Sequence[int],
    *,
    max_new_tokens: int,
    eos_token_ids: Iterable[int] = (),
    num_layers: int = 0,
    skipped_layers: int = 0,
    prefill_logits: torch.Tensor | None = None,
    features: torch.Tensor | None = None,
    max_context: int | None = None,
) -> DecodeStats:
    """Replay ``drafter`` over the greedy output ``tokens``: the engine's statistics, exactly.

    The engine's greedy step accepts the longest tree path whose tokens equal the target's
    argmax, then commits the target's next token; here the argmax at every position is the
    output itself. The first token (the prefill's) belongs to no step (:class:`DecodeStats`);
    commits stop at a stop token and at ``max_new_tokens``, as in the engine.

    Args:
        prompt: ``torch.LongTensor`` of shape ``(P,)``.
        tokens: the target's greedy output (ending at its first stop token, if any).
        prefill_logits: ``(1, vocab)`` for drafters with prefill feedback.
        features: ``(P + len(tokens) - 1, hidden)``: target features (EAGLE).
        max_context: the target's positions (``TargetModel.max_context``): drafts are capped
            to it and to the tokens left, as in the engine (``tss_opt.decoding.budget``).

    Returns:
        The stats of the request (no timings: the caller sets ``total_s``).
    """
    drafter = drafter if drafter is not None else NoDrafter()
    eos = frozenset(int(t) for t in eos_token_ids)
    prompt = torch.as_tensor(prompt, dtype=torch.long).reshape(-1).cpu()
    P = int(prompt.numel())
    y = [int(t) for t in tokens]
    stats = DecodeStats(prompt_tokens=P, num_layers=num_layers, skipped_layers=skipped_layers)
    if not y:
        return stats
    seq = torch.tensor(prompt.tolist() + y, dtype=torch.long)
    drafter.reset(prompt)
    if drafter.capabilities.prefill_feedback:
        if features is None or prefill_logits is None:
            raise ReplayError(f"{type(drafter).__name__} needs the target's features; pass features= and prefill_logits=")
        drafter.prefill_feedback(prompt, prefill_logits, features[:P])
    n_out = 1
    done = y[0] in eos
    while not done and n_out < max_new_tokens:
        root, root_pos = y[n_out - 1], P + n_out - 1  # the last committed token and its position
        limit = draft_depth_limit(root_pos, max_new_tokens - n_out, max_context or (1 << 62))
        tree = prune_depth(drafter.propose_within(seq[: P + n_out], limit), limit)
        tree_tokens = tree.tokens.tolist()
        kids = tree.children()
        accepted: list[int] = []
        row = 0
        # walk while the output has a token to compare with (beyond it, commits are cut anyway)
        while n_out + len(accepted) < len(y):
            want = y[n_out + len(accepted)]
            nxt = next((c for c in kids[row] if tree_tokens[c] == want), None)
            if nxt is None:
                break
            accepted.append(nxt)
            row = nxt + 1
        committed = y[n_out : n_out + len(accepted) + 1]  # accepted tokens + the target's next
        kept = 0
        for t in committed:
            if n_out >= max_new_tokens:
                break
            n_out += 1
            kept += 1
            if t in eos:
                done = True
                break
        if n_out >= len(y):
            done = True  # the output ends here (budget or stop token)
        stats.steps += 1
        stats.step_tokens += kept
        stats.draft_proposed += len(tree)
        stats.draft_accepted += min(len(accepted), kept)
        if not done:
            drafter.update(_feedback(tree, accepted, committed, features, root_pos, root))
    stats.new_tokens = n_out
    stats.verify_layer_forwards = stats.steps * (num_layers - skipped_layers)
    return stats


def _feedback(
    tree: Any, accepted: list[int], committed: list[int], features: torch.Tensor | None, root_pos: int, root: int
) -> VerifyFeedback:
    """The engine's feedback as far as the replay knows it: hidden rows of the root and the
    accepted path (features of committed tokens); no logits (shape ``(n + 1, 0)``)."""
    n1 = len(tree) + 1
    if features is not None:
        hidden = torch.zeros(n1, features.shape[-1], dtype=features.dtype, device=features.device)
        rows = [0, *(i + 1 for i in accepted)]
        hidden[rows] = features[root_pos : root_pos + len(rows)]
    else:
        hidden = torch.zeros(n1, 0)
    return VerifyFeedback(
        tree=tree, accepted=tuple(accepted), committed=torch.tensor(committed, dtype=torch.long),
        logits=torch.zeros(n1, 0), hidden=hidden, root_token=root,
    )


def check_replay_protocol(protocol: DecodeProtocol) -> None:
    """Refuse a protocol the replay cannot reproduce: measured cost, sampling, a relaxed rule
    or an unknown scope.

    Raises:
        ReplayError: naming the setting and the fix.
    """
    if protocol.cost != "analytic":
        raise ReplayError(
            f"cost={protocol.cost!r} cannot be used with evaluator=replay: the replay runs no speculative decoding "
            "to time; use cost=analytic, or evaluator=engine for the measured cost"
        )
    if protocol.temperature != 0:
        raise ReplayError(
            f"temperature={protocol.temperature} cannot be used with evaluator=replay: only greedy decoding "
            "(temperature=0) is replayed exactly; use evaluator=engine for speculative sampling"
        )
    if protocol.scope not in SCOPES:
        raise ReplayError(f"scope={protocol.scope!r} is not a skip scope; expected one of {', '.join(SCOPES)}")
    if protocol.verifier.lossy:
        raise ReplayError(
            f"verification={protocol.verifier.describe()} cannot be used with evaluator=replay: the replay walks "
            "exact greedy acceptance only; use evaluator=engine for a relaxed rule"
        )


# ----------------------------------------------------------------------------- evaluator
class ReplayEvaluator(PromptSetEvaluator):
    """The trial evaluator of ``evaluator=replay``: batched greedy generation + drafter replay.

    Same arguments and contract as :class:`~tss_opt.evaluation.evaluator.SpecDecodeEvaluator`
    (a :class:`~tss_opt.evaluation.prompt_set.PromptSet`, ``per_prompt``, ``num_prompts``,
    ``prompt_ids=``), plus ``batch_size``. Of the prompt set's protocol, ``cost`` must be ``"analytic"``
    (no real decoding is timed), ``temperature`` 0 (the replay of speculative sampling is not
    exact) and ``verification`` exact; ``reuse_prefill`` in ``verify`` scope keeps each
    prompt's dense prefill (the engine evaluator's store, one KV cache per prompt) and starts
    every row from a copy.

    Args:
        batch_size: prompts per generation (each a row per skip set of a group); ``None`` =
            :data:`DEFAULT_BATCH_SIZE` for the target's device type.
        source: what generates the greedy outputs (:class:`~tss_opt.decoding.greedy.GreedySource`);
            ``None`` = the batch engine on ``target`` (:class:`~tss_opt.decoding.greedy.BatchGreedy`).

    Per prompt, ``tokens_per_s`` is the prompt's tokens over its share of the batch's wall
    time: a throughput of the replay, not of speculative decoding. Its results say so
    (``evaluator: "replay"``) and their contract mapping names it ``replay_tokens_per_s``, so
    the search records no ``tokens_per_s`` for a replayed trial.
    """

    def __init__(
        self,
        target: TargetModel,
        tokenizer: Any,
        drafter_factory: Callable[[], Drafter | None],
        prompts: PromptSet,
        *,
        show_progress: bool = True,
        prefill_store_gib: float | None = None,
        batch_size: int | None = None,
        source: GreedySource | None = None,
    ) -> None:
        protocol = prompts.protocol
        check_replay_protocol(protocol)
        if batch_size is not None and int(batch_size) < 1:
            raise ReplayError(f"evaluator.batch_size={batch_size}; expected a positive integer, or null for the default")
        if not prompts.examples:
            raise ReplayError("the evaluator got no prompts; check the domain's split sizes")
        check_replayable(drafter_factory())  # fail at build time, not in the first trial
        super().__init__(
            target, tokenizer, drafter_factory, prompts.replace(protocol=protocol.replace(temperature=0.0)),
            show_progress=show_progress, prefill_store_gib=prefill_store_gib,
        )
        self.batch_size = int(batch_size) if batch_size is not None else default_batch_size(target.device)
        self.source = source
        self._generate: GreedySource = source if source is not None else BatchGreedy(target)

    def _options(self) -> dict[str, Any]:
        return {**super()._options(), "batch_size": self.batch_size, "source": self.source}

    kind: ClassVar[str] = "replay"
    """Results say ``evaluator: replay`` and carry ``replay_tokens_per_s``, never ``tokens_per_s``."""

    supports_groups = True
    """Grouped trials: :meth:`evaluate_group` runs several skip sets in one batch."""

    def evaluate(
        self, skip: frozenset[int] | Sequence[int] = frozenset(), prompt_ids: Sequence[int] | None = None
    ) -> EvalResult:
        """Measure one skip set on every prompt, or on ``prompt_ids`` in that order.

        Prompts are generated in the given order, ``batch_size`` at a time; a prompt's
        figures do not depend on its batch (each row computes as its request alone).
        """
        return self.evaluate_group([skip], prompt_ids)[0]

    def call_group(
        self, skips: Sequence[frozenset[int]], prompt_ids: Sequence[int] | None = None
    ) -> list[dict[str, Any]]:
        """The search's grouped contract (:mod:`tss_opt.search.grouping`): one evaluator answer
        per skip set, as ``self(skip, prompt_ids)`` gives it."""
        return [r.to_dict() for r in self.evaluate_group(skips, prompt_ids)]

    def evaluate_group(
        self, skips: Sequence[frozenset[int] | Sequence[int]], prompt_ids: Sequence[int] | None = None
    ) -> list[EvalResult]:
        """Measure several skip sets on the same prompts, generated together (grouped trials).

        Each batch of ``batch_size`` prompts is one generation of ``len(skips) x batch`` rows,
        every row on its own skip set; in ``verify`` scope each prompt's dense prefill is
        computed (or taken from the kept prefills) once and every row of it starts from a copy.

        Returns:
            One result per skip set, in order; per prompt equal to :meth:`evaluate` of that
            set alone. A prompt's ``tokens_per_s`` is its tokens over its share of the batch's
            wall time (the batch's time divided by its rows, all skip sets included).
        """
        from tss_opt.decoding.skip import validate_skip

        sets = [validate_skip(skip, self.num_layers) for skip in skips]
        if not sets:
            raise ReplayError("evaluate_group got no skip sets; pass at least one")
        order = self._check_prompt_ids(prompt_ids)
        drafters = [self.drafter_factory() for _ in sets]  # one per trial, as evaluate() builds
        for drafter in drafters:
            check_replayable(drafter)
        keep_hidden = bool(drafters[0] is not None and drafters[0].capabilities.prefill_feedback)
        G = len(sets)
        outputs: list[list[str]] = [[] for _ in sets]
        tokens: list[list[list[int]]] = [[] for _ in sets]
        stats: list[list[DecodeStats]] = [[] for _ in sets]
        t0 = time.perf_counter()
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            tb = time.perf_counter()
            groups = self._generate(
                [self.prompt_tokens[i] for i in batch], sets, max_new_tokens=self.max_new_tokens, scope=self.scope,
                eos_token_ids=self.eos_token_ids, keep_hidden=keep_hidden, prefills=self._dense_prefills(batch),
            )
            for g, (skip, drafter, gens) in enumerate(zip(sets, drafters, groups, strict=True)):
                with self.target.skip(skip):  # as in the engine: self-drafting nests its skip set inside
                    for i, gen in zip(batch, gens, strict=True):
                        s = replay_stats(
                            drafter, self.prompt_tokens[i], gen.tokens, max_new_tokens=self.max_new_tokens,
                            eos_token_ids=self.eos_token_ids, num_layers=self.num_layers, skipped_layers=len(skip),
                            prefill_logits=gen.prefill_logits, features=gen.features,
                            max_context=self.target.max_context,
                        )
                        stats[g].append(s)
                        tokens[g].append(gen.tokens)
                        outputs[g].append(self.tokenizer.decode(gen.tokens, skip_special_tokens=True))
            share = (time.perf_counter() - tb) / (len(batch) * G)
            for per_set in stats:
                for s in per_set[-len(batch) :]:
                    s.total_s = share
            prompts_done(len(batch) * G)  # a caller's prompt bar, if one is open
            if self.show_progress:  # per batch: DEBUG (the search logs one INFO line per trial)
                log.debug(
                    "  skip=%s prompts %d-%d/%d replayed", " ".join(str(sorted(x)) for x in sets), start + 1,
                    start + len(batch), len(order),
                )
        wall = (time.perf_counter() - t0) / G  # each set's share of the group's time
        return [
            self._aggregate(skip, order, outputs[g], stats[g], tokens[g], wall_s=wall) for g, skip in enumerate(sets)
        ]

    def _dense_prefills(self, batch: list[int]) -> list[DensePrefill] | None:
        """The batch's dense prefills in ``verify`` scope (kept ones when ``reuse_prefill``,
        else computed for this call only, shared by its skip sets); ``None`` in ``all`` scope,
        where every row prefills under its own skip set."""
        if self.scope != "verify":
            return None
        kept = [self._prefill(i) for i in batch]
        return [p if p is not None else dense_prefill(self.target, self.prompt_tokens[i]) for i, p in zip(batch, kept)]
