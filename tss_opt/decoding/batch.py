"""Continuous batching: many requests decode in the same target forwards, each on its own
skip set, each with its own drafter.

:class:`BatchEngine` is the engine with batch as a first-class dimension. A request is
:meth:`~BatchEngine.admit`-ted at any time; every :meth:`~BatchEngine.step` runs **one**
target forward (:func:`~tss_opt.decoding.ragged.ragged_forward`) over

- the prompts of the rows admitted since the last step (their prefill: they join now), and
- one speculative step of every running row: its drafter's tree below its last token,

then accepts and commits per row with the single-request engine's own rules
(:class:`SpeculativeEngine`: one per row, holding that row's drafter, acceptance rule and stop
tokens). A row leaves when it finishes (EOS, its length) or when its caller drops it
(cancelled, a stop string): the next step no longer carries it, and nobody waits for a wave.

How far rows draft in a step is chosen per step from measured costs
(:class:`~tss_opt.decoding.batch_budget.DepthPolicy`): alone, a row drafts what its drafter
chooses; as the batch grows, drafted tokens per row shrink, down to none (batched plain
decoding on each row's sparse target, which emits the same tokens).

Greedy output of every row is exactly what the request alone emits (each row's forward is
the same computation on its own cache; only the linear layers see the other rows' tokens),
and seeded sampling is reproducible per request (positional draws, ``accept.py``).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from tss_opt.decoding.batch_budget import DepthPolicy, RowOdds
from tss_opt.decoding.cache import request_capacity
from tss_opt.decoding.drafter import Drafter
from tss_opt.decoding.engine import GenerationResult, SpeculativeEngine, _Request, checked_request
from tss_opt.decoding.prefill import DensePrefill
from tss_opt.decoding.ragged import RaggedRow, ragged_forward
from tss_opt.decoding.skip import validate_skip
from tss_opt.decoding.stats import DecodeStats
from tss_opt.decoding.target import TargetModel
from tss_opt.decoding.tree import DraftTree
from tss_opt.decoding.verify.relaxed import Verifier

__all__ = ["BatchEngine", "Row", "RowStep"]

@dataclass(eq=False)
class Row:
    """One request in the batch.

    Attributes:
        engine: the row's single-request engine (its drafter, acceptance rule, stop tokens).
        prompt: ``torch.LongTensor`` of shape ``(P,)``.
        skip: the layers this row bypasses (kept for the whole request).
        scope: ``"verify"`` (dense prefill) or ``"all"``.
        state: the request's decoding state (``None`` until its prefill ran).
        tag: the caller's handle (the server's job); never read here.
        proposed_steps: steps in which the drafter proposed anything (the proposal rate).
        features: when recorded (``admit(record_features=True)``), the target's final hidden
            states of the tokens fed so far, one tensor per forward: ``(P, hidden)`` for the
            prompt, then ``(1 + accepted, hidden)`` per step (the root and the accepted path).
        prefill_logits: when recorded, ``(1, vocab)``: the logits at the last prompt position.
    """

    engine: SpeculativeEngine
    prompt: torch.Tensor
    max_new_tokens: int
    skip: frozenset[int]
    scope: str
    temperature: float
    seed: int | None
    state: _Request | None = None
    tag: object = None
    proposed_steps: int = 0
    admitted_at: float = field(default_factory=time.perf_counter)
    features: list[torch.Tensor] | None = None
    prefill_logits: torch.Tensor | None = None

    @property
    def started(self) -> bool:
        return self.state is not None

    @property
    def done(self) -> bool:
        """EOS reached or every token generated (a dropped row is simply no longer stepped)."""
        s = self.state
        return s is not None and (s.done or s.n_out >= s.max_new_tokens)

    @property
    def tokens(self) -> torch.Tensor:
        """``torch.LongTensor`` of shape ``(n,)``: the tokens generated so far."""
        s = self.state
        if s is None:
            return torch.empty(0, dtype=torch.long)
        P = len(s.prompt)
        return s.seq[P : P + s.n_out]

    def odds(self) -> RowOdds:
        """What this row's history says about drafting deeper (the depth policy's input)."""
        s = self.state
        if s is None or s.stats.steps == 0:
            return RowOdds()
        st = s.stats
        return RowOdds(
            proposal_rate=self.proposed_steps / st.steps,
            acceptance=st.draft_accepted / st.draft_proposed if st.draft_proposed else None,
            steps=st.steps,
        )

    def result(self) -> GenerationResult:
        """The request's tokens and statistics (``total_s``: admission to now); a row dropped
        before its first step has no tokens."""
        if self.state is None:
            stats = DecodeStats(prompt_tokens=int(self.prompt.numel()), num_layers=self.engine.target.num_layers,
                                skipped_layers=len(self.skip), verification=self.engine.verifier.describe())
        else:
            stats = self.state.stats
            stats.new_tokens = self.state.n_out
        stats.total_s = time.perf_counter() - self.admitted_at
        return GenerationResult(tokens=self.tokens.clone(), stats=stats)


@dataclass
class RowStep:
    """What one step did for one row.

    Attributes:
        row: the row.
        tokens: ``torch.LongTensor`` of shape ``(k,)``: the tokens committed in this step.
        done: the row finished in this step (EOS or its length).
    """

    row: Row
    tokens: torch.Tensor
    done: bool


class BatchEngine:
    """Decodes any number of requests together on one target.

    Args:
        target: the verifier, shared by every row.
        depth: chooses each step's draft depth from the batch (``None``: every row drafts
            what its drafter chooses, as alone).
    """

    def __init__(self, target: TargetModel, depth: DepthPolicy | None = None) -> None:
        self.target = target
        self.depth = depth
        self.rows: list[Row] = []
        self.steps = 0
        self.last_depth: int | None = None  # the cap the last step used (None: none)

    def __len__(self) -> int:
        return len(self.rows)

    # -------------------------------------------------------------------------- requests
    def admit(
        self,
        prompt_ids: torch.Tensor | Sequence[int],
        *,
        max_new_tokens: int,
        drafter: Drafter | None = None,
        skip: Iterable[int] = (),
        scope: str = "verify",
        temperature: float = 0.0,
        seed: int | None = None,
        eos_token_ids: Iterable[int] = (),
        verification: Verifier | str = "exact",
        tag: object = None,
        prefill: DensePrefill | None = None,
        record_features: bool = False,
    ) -> Row:
        """Add a request; its prefill runs in the next :meth:`step`, with the other rows.

        Args:
            prompt_ids: ``torch.LongTensor`` of shape ``(P,)``.
            drafter: this request's own drafter (``None``: plain decoding).
            skip: the layers this request bypasses, for all its steps.
            verification: the acceptance rule; a lossy rule keeps per-request state, so each
                row gets its own copy.
            prefill: this prompt's dense prefill computed earlier (``scope="verify"`` only):
                the row starts from a copy of it now and runs no prompt forward.
            record_features: keep the target's hidden states of every token fed back and the
                prefill's logits on the row (:attr:`Row.features`; the replay's EAGLE input).

        Raises:
            ValueError: an empty prompt, ``max_new_tokens`` < 1 or an unknown scope.
            ContextLengthError: the prompt and ``max_new_tokens`` exceed the context.
            SkipError: a skip set out of the model's range.
        """
        prompt = checked_request(self.target, prompt_ids, max_new_tokens, scope)
        if isinstance(verification, Verifier) and verification.lossy:
            verification = copy.deepcopy(verification)  # its policies keep per-request state
        engine = SpeculativeEngine(self.target, drafter, eos_token_ids=eos_token_ids, verification=verification)
        row = Row(
            engine=engine, prompt=prompt, max_new_tokens=max_new_tokens,
            skip=validate_skip(skip, self.target.num_layers), scope=scope, temperature=float(temperature),
            seed=seed, tag=tag, features=[] if record_features else None,
        )
        if prefill is not None:  # restored now: the row's first step is already a verification
            # The copy grows in place (engine.prefill), as the rows this engine prefills itself do.
            row.state = engine.prefill(prompt, max_new_tokens, row.skip, scope, row.temperature, seed, reused=prefill)
            self._record(row, prefill.hidden, prefill.logits)
        self.rows.append(row)
        return row

    @staticmethod
    def _record(row: Row, hidden: torch.Tensor, prefill_logits: torch.Tensor | None = None) -> None:
        """Keep ``hidden`` (``(n, hidden)``) on a row that records its features."""
        if row.features is None:
            return
        row.features.append(hidden)
        if prefill_logits is not None:
            row.prefill_logits = prefill_logits

    def drop(self, row: Row) -> None:
        """Take ``row`` out of the batch (finished, cancelled, stopped); a no-op if gone."""
        try:
            self.rows.remove(row)
        except ValueError:
            pass

    # -------------------------------------------------------------------------- the step
    @torch.inference_mode()
    def step(self) -> list[RowStep]:
        """One target forward for every row: prefills of the new rows, a verification step
        of the running ones. Finished rows are taken out of the batch.

        Returns:
            One :class:`RowStep` per row that was in the batch, in batch order.
        """
        rows = list(self.rows)
        if not rows:
            return []
        running = [r for r in rows if r.started and not r.done]
        cap = self.depth.choose(len(rows), [r.odds() for r in running]) if self.depth is not None and running else None
        self.last_depth = cap
        inputs: list[RaggedRow] = []
        trees: list[DraftTree | None] = []
        draft_s: list[float] = []
        for row in rows:
            t = time.perf_counter()
            if not row.started:
                row.state = row.engine.start(row.prompt, row.max_new_tokens, row.skip, row.temperature, row.seed)
                prefill_skip = row.skip if row.scope == "all" else frozenset()
                # Room for the request and a draft tree: appends in place, no copy per step.
                cache = self.target.new_cache(capacity=request_capacity(len(row.prompt), row.max_new_tokens))
                inputs.append(RaggedRow(cache=cache, skip=prefill_skip, prompt=row.prompt))
                trees.append(None)
            else:
                s = row.state
                assert s is not None
                tree = row.engine.draft(s, cap)
                if len(tree):
                    row.proposed_steps += 1
                inputs.append(RaggedRow(cache=s.cache, skip=row.skip, root=s.last, tree=tree, prefix_len=s.prefix_len))
                trees.append(tree)
            draft_s.append(time.perf_counter() - t)
        t1 = time.perf_counter()
        outputs = ragged_forward(self.target, inputs)
        forward_s = time.perf_counter() - t1
        out: list[RowStep] = []
        for row, inp, tree, o, d_s in zip(rows, inputs, trees, outputs, draft_s):
            s = row.state
            assert s is not None
            t = time.perf_counter()
            before = s.n_out
            if tree is None:  # the prefill: its first token
                row.engine.first_token(s, inp.cache, o.logits, o.hidden)
                s.stats.prefill_layer_forwards = o.executed
                if row.features is not None:  # copies only for a recording row (the server's rows do not)
                    self._record(row, o.hidden.clone(), o.logits.clone())
            else:
                accepted, committed = row.engine.accept(s, tree, o.logits)
                row.engine.commit(s, tree, accepted, committed, o.logits, o.hidden)
                if row.features is not None:
                    self._record(row, o.hidden[[0, *(a + 1 for a in accepted)]])  # the fed tokens' rows
                s.stats.verify_layer_forwards += o.executed
                s.stats.verify_s += forward_s
                s.stats.draft_s += d_s + (time.perf_counter() - t)
            P = len(s.prompt)
            out.append(RowStep(row=row, tokens=s.seq[P + before : P + s.n_out].clone(), done=row.done))
        self.steps += 1
        self.rows = [r for r in self.rows if not r.done]
        return out

    def run(self) -> None:
        """Step until every row has finished (tests and one-shot callers)."""
        while self.rows:
            self.step()
