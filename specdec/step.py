"""One verify step over a batch of sequences (a single sequence is a batch of one), and one commit.

Every path verifies through `verify_step`: the in-process engine, in-process batching, the target
worker and its tensor-parallel followers. Sequences differ in cache length and tree size, so a step
pads them into one forward:
    cache  [B, heads, L, head_dim]    every sequence's cache, left-aligned (kept in a BatchCache)
    input  [B, N]                     [root] + tree nodes, N = most rows
    mask   [B, 1, N, L + N]           row r of sequence i sees its own cache [0, L_i) and, among the new
                                      columns L.., its tree ancestors and itself; padding rows see only
                                      themselves (no all -inf row, no NaN)
    positions [B, N]                  L_i + depth
On specdec's lean walk (CPU) the forward computes each sequence's own rows only (ragged: no padding
row costs a row's products), returned packed [sum rows, hidden]; elsewhere the padded forward's rows
are packed after it. After the forward each sequence keeps its cache plus the columns of its root and
accepted path.

All or nothing: until the cache commit has finished, a failure rolls every cache and sampling
generator back to where the step found them, so the step can be retried (alone, by
`verify_each`) without stepping any sequence twice.
"""
from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

import torch

from specdec import parallel
from specdec.batch_cache import BatchCache
from specdec.core.tree import DraftTree, TreeLayout, tree_layout
from specdec.models.runner import ModelRunner
from specdec.policy import SpeculationPolicy, is_sampled
from specdec.sequence import Sequence, StepResult
from specdec.step_pack import causal_runs as _causal_runs, pack as _pack

log = logging.getLogger(__name__)


@dataclass
class StepTimes:
    """time.monotonic() readings of one verify step, for its trace span: started, forward and
    verdicts done (the rest is the commit). Reading a clock is all tracing costs inside the step."""

    start: float = 0.0
    forward_end: float = 0.0


@dataclass(frozen=True)
class StepFailure:
    """A sequence whose step could not be done; `reason` names the cause (for an INTERNAL status)."""

    reason: str


def verify_step(runner: ModelRunner, seqs: list[Sequence], trees: list[DraftTree],
                pool: BatchCache, fault=None, times: StepTimes | None = None) -> list[StepResult | StepFailure]:
    """Verify trees[i] for seqs[i] (all unfinished) in one forward and commit. Raises (with every
    cache and generator rolled back) or returns one result per sequence. fault(seqs): a test hook
    called after the forward and the verdicts, just before the commit (the last point rolled back).
    times: filled with the step's clock readings (tracing)."""
    order = pool.arrange(seqs)  # row k steps seqs[order[k]]: sequences stay in the cache rows they hold
    if order != list(range(len(seqs))):
        results = verify_step(runner, [seqs[j] for j in order], [trees[j] for j in order], pool, fault, times)
        unordered: list = [None] * len(seqs)
        for k, j in enumerate(order):
            unordered[j] = results[k]
        return unordered
    start = time.perf_counter()
    if times is not None:
        times.start = time.monotonic()
    layouts = [tree_layout(t.parent_ids) for t in trees]
    cache, cache_lens = pool.take(seqs)
    states = [None if s.generator is None or not isinstance(s.generator, torch.Generator)
              else s.generator.get_state() for s in seqs]
    try:
        ids, bias, positions = _pack(runner, seqs, trees, layouts, cache_lens, _causal_runs(runner, cache, layouts))
        num_rows = [layout.num_rows for layout in layouts]
        flat = runner.forward_rows(ids, cache, bias, positions, num_rows)  # [sum rows, hidden], no padding rows
        verdicts = _verdicts(runner, seqs, trees, layouts, runner.logits(flat), num_rows)
        if times is not None:
            times.forward_end = time.monotonic()
        if fault is not None:
            fault(seqs)
        pool.commit([[0, *v.accepted_rows] for v in verdicts])  # root + accepted path, per row
    except BaseException:
        pool.rollback()
        for seq, state in zip(seqs, states):
            if state is not None:
                seq.generator.set_state(state)
        raise
    verify_s = time.perf_counter() - start
    features = runner.features(flat)  # [sum rows, F]: flat itself unless a head reads fused layers
    results: list[StepResult | StepFailure] = []
    starts = [0, *itertools.accumulate(num_rows)]
    for seq, tree, layout, verdict, at, n in zip(seqs, trees, layouts, verdicts, starts, num_rows):
        try:  # past the cache commit nothing is retried: a failure here fails this sequence only
            results.append(seq.commit_verified(tree, layout, verdict, flat[at:at + n], verify_s, features[at:at + n]))
        except Exception as exc:  # noqa: BLE001
            log.exception("commit failed")
            seq.finish_reason = "error"
            results.append(StepFailure(f"commit failed: {type(exc).__name__}: {exc}"))
    if all(seq.finish_reason is not None for seq in seqs):
        pool.settle()  # frees the kept cache once no unfinished sequence is left in it
    return results


def verify_each(runner: ModelRunner, seqs: list[Sequence], trees: list[DraftTree], pool: BatchCache,
                fault=None, times: StepTimes | None = None) -> list[StepResult | StepFailure]:
    """The batch in one forward; if that fails (rolled back), each sequence alone, so a sequence that
    fails alone fails alone and the others decode on. fault, times: verify_step's."""
    try:
        return list(verify_step(runner, seqs, trees, pool, fault, times))
    except Exception as exc:  # noqa: BLE001 - judged per sequence below
        if len(seqs) == 1:
            log.exception("verify step failed")
            return [StepFailure(f"verify step failed: {type(exc).__name__}: {exc}")]
        log.exception("batched verify failed; stepping the %d sequences one by one", len(seqs))
    return [verify_each(runner, [seq], [tree], pool, fault, times)[0] for seq, tree in zip(seqs, trees)]


def verify_timed(runner: ModelRunner, seqs: list[Sequence], trees: list[DraftTree], pool: BatchCache,
                 fault=None, times: StepTimes | None = None) -> tuple[list[StepResult | StepFailure], bool]:
    """verify_each, and whether its wall time is what such a step costs: False where the thread team ran
    its forward the slower way on purpose (a warm-up or a probe, specdec.kernels.team), whose seconds the
    speculation policy must not learn. Every step that the policy times goes through here."""
    probes = runner.num_team_probes
    results = verify_each(runner, seqs, trees, pool, fault, times)
    return results, runner.num_team_probes == probes


def _verdicts(runner: ModelRunner, seqs: list[Sequence], trees: list[DraftTree], layouts: list[TreeLayout],
              logits: torch.Tensor, num_rows: list[int]) -> list:
    """Each sequence's verdict from logits [sum rows, vocab] (on the model's device). Greedy rows
    come to the host in one copy for the whole step (argmax [sum rows]); the tree walks then read
    host lists, with no device sync per node."""
    argmax = runner.greedy_ids(logits).tolist() if any(s.params.greedy for s in seqs) else None
    per_seq = logits.split(num_rows)  # B x [rows_i, vocab]
    verdicts, offset = [], 0
    for seq, tree, layout, rows, n in zip(seqs, trees, layouts, per_seq, num_rows):
        verdicts.append(seq.verify(tree, layout, rows, None if argmax is None else argmax[offset:offset + n]))
        offset += n
    return verdicts


@dataclass
class Drafting:
    """One sequence's part in a decode step: its key in the policy and its drafter session (None:
    no drafter here; a draft may still come from elsewhere as `tree`)."""

    key: str
    seq: Sequence
    session: object | None = None
    tree: DraftTree | None = None
    # this step's draft made here: (time.monotonic() at its start, seconds, depth asked, nodes drafted)
    drafted: tuple[float, float, int, int] | None = None


def plan_all(policy: SpeculationPolicy, entries: list[Drafting], max_len: int) -> list:
    """Each drafting entry's DraftBudget for this step (None: it drafts nothing here), fixed before
    anything is drafted."""
    budgets = []
    for e in entries:
        if e.tree is not None or e.session is None:
            budgets.append(None)
            continue
        limit = min(e.seq.num_remaining - 1, max_len - len(e.seq.context) - 1)  # never draft past the end
        budgets.append(policy.plan(e.key, limit, scored=getattr(e.session, "scores_nodes", False)))
    return budgets


def propose_all(entries: list[Drafting], budgets: list, agree=None) -> tuple[list[DraftTree], float]:
    """Each entry's tree: its given tree, or a fresh draft within its budget. A drafter that fails
    costs its sequence the draft, nothing more. agree(depth): where every tensor-parallel rank drafts
    (the engine under --tp), rank 0's depth for all. Returns (trees, seconds spent drafting)."""
    start = time.perf_counter()
    depths = [None if b is None else b.depth if agree is None else agree(b.depth) for b in budgets]
    prepare_together(entries, budgets, depths)
    trees = []
    for e, budget, depth in zip(entries, budgets, depths):
        tree = e.tree if e.tree is not None else DraftTree.empty()
        e.drafted = None
        if budget is not None:  # depth: under tensor parallelism rank 0's, so ranks verify the same tree
            began = time.monotonic()
            try:
                if depth > 0:
                    tree = e.session.propose(e.seq.context, depth, e.seq.params, e.seq.generator,
                                             max_nodes=budget.max_nodes)
            except Exception:  # noqa: BLE001
                log.exception("drafting failed for %s; verifying without a draft", e.key)
            e.drafted = (began, time.monotonic() - began, depth, tree.num_nodes)
        trees.append(tree)
    return trees, time.perf_counter() - start


def prepare_together(entries: list[Drafting], budgets: list, depths: list) -> None:
    """Work that drafters do faster for many sequences at once, done for the batch before each sequence
    drafts: sessions naming the same `batch_owner` (Medusa heads: one product for every sequence's
    hidden state, whose weights then stream once a step instead of once a sequence). What a sequence
    drafts is the same either way; a failure here only leaves each session to do its own part."""
    groups: dict[int, tuple[object, list]] = {}
    for e, budget, depth in zip(entries, budgets, depths):
        owner = getattr(e.session, "batch_owner", None)
        if budget is not None and depth and owner is not None and hasattr(owner, "prepare"):
            groups.setdefault(id(owner), (owner, []))[1].append((e.session, depth, budget.max_nodes))
    for owner, items in groups.values():
        if len(items) > 1:
            try:
                owner.prepare(items)
            except Exception:  # noqa: BLE001
                log.exception("drafting ahead for %d sequences failed; each drafts alone", len(items))


def decode_step(runner: ModelRunner, policy: SpeculationPolicy, pool: BatchCache, entries: list[Drafting],
                max_len: int, fault=None) -> tuple[list[DraftTree], list[StepResult | StepFailure], float]:
    """Draft, choose what to verify, verify, learn: one step of every entry, as prose.
    Returns (trees as verified, results, seconds spent drafting)."""
    trees, draft_s = propose_all(entries, plan_all(policy, entries, max_len), agree=parallel.broadcast_int)
    keys = [e.key for e in entries]
    trees = policy.allocate(keys, trees, [is_sampled(t, e.seq.params.greedy) for t, e in zip(trees, entries)],
                            agree=parallel.broadcast_int)
    start = time.perf_counter()
    results, timed = verify_timed(runner, [e.seq for e in entries], trees, pool, fault)
    policy.record(keys, trees, [r if isinstance(r, StepResult) else None for r in results],
                  time.perf_counter() - start, draft_s, timed=timed)
    return trees, results, draft_s
