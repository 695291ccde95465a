"""Batched verification: one target forward checks the draft trees of many sequences.

Sequences differ in cache length and tree size, so each step pads them into one batch:
    cache  [B, heads, L, head_dim]    every sequence's cache, left-aligned, L = longest cache
    input  [B, N]                     [root] + tree nodes, N = most rows
    mask   [B, 1, N, L + N]           row r of sequence i sees its own cache [0, L_i) and, among the new
                                      columns L.., its tree ancestors and itself; padding rows see only
                                      themselves (no all -inf row, no NaN)
    positions [B, N]                  L_i + depth
After the forward each sequence keeps its own cache entries plus the columns of its root and accepted
path (kv.keep_rows' rule), so the per-sequence state is exactly what `Sequence.step` would leave.
The stacked cache stays in a `BatchCache` between steps of the same batch (specdec.batch_cache).
"""
from __future__ import annotations

import time

import torch

from specdec.batch_cache import BatchCache
from specdec.core.tree import DraftTree, tree_layout
from specdec.models.runner import ModelRunner
from specdec.sequence import Sequence, StepResult


def step_batch(runner: ModelRunner, seqs: list[Sequence], trees: list[DraftTree],
               pool: BatchCache | None = None) -> list[StepResult]:
    """Verify trees[i] for seqs[i] (all unfinished) in one forward; returns each sequence's StepResult.

    pool: keeps the stacked cache for the next step of the same batch (None: stack and split per call)."""
    if len(seqs) == 1:
        return [seqs[0].step(trees[0])]
    start = time.perf_counter()
    layouts = [tree_layout(t.parent_ids) for t in trees]
    own_pool = pool is None
    pool = BatchCache(runner) if own_pool else pool
    cache, cache_lens = pool.take(seqs)
    num_rows = [layout.num_rows for layout in layouts]
    max_len, max_rows, batch = max(cache_lens), max(num_rows), len(seqs)
    ids = torch.zeros(batch, max_rows, dtype=torch.long)
    positions = torch.zeros(batch, max_rows, dtype=torch.long)
    bias = torch.full((batch, 1, max_rows, max_len + max_rows), torch.finfo(runner.dtype).min, dtype=runner.dtype)
    for i, (seq, tree, layout) in enumerate(zip(seqs, trees, layouts)):
        n = num_rows[i]
        ids[i, :n] = torch.tensor([seq.context[-1], *tree.token_ids])
        positions[i, :n] = torch.tensor(layout.depths) + cache_lens[i]
        positions[i, n:] = cache_lens[i]
        bias[i, 0, :n, :cache_lens[i]] = 0.0
        bias[i, 0, :n, max_len:max_len + n].masked_fill_(layout.mask, 0.0)
        pad = torch.arange(n, max_rows)
        bias[i, 0, pad, max_len + pad] = 0.0
    hidden = runner.forward_batch(ids, cache, bias, positions)  # [B, N, hidden]
    flat = torch.cat([hidden[i, :n] for i, n in enumerate(num_rows)])  # [sum rows, hidden]
    logits = runner.logits(flat).split(num_rows)  # B x [rows_i, vocab]
    verify_s = time.perf_counter() - start
    verdicts = [seq.verify(tree, layout, logits[i]) for i, (seq, tree, layout) in enumerate(zip(seqs, trees, layouts))]
    pool.commit([[0, *v.accepted_rows] for v in verdicts])  # root + accepted path, per row
    results = [seq.commit_verified(tree, layout, v, hidden[i, :num_rows[i]], verify_s)
               for i, (seq, tree, layout, v) in enumerate(zip(seqs, trees, layouts, verdicts))]
    if own_pool or all(seq.finish_reason is not None for seq in seqs):
        pool.release()
    return results


def generate_batch(engine, prompts: list, params, max_batch: int = 8, chat: bool = False,
                   load_aware: bool = True) -> list[list[int]]:
    """Continuous batching in process: up to max_batch sequences step together; a finished sequence
    leaves and the next prompt joins between steps. Each sequence's controller picks its draft depth,
    capped by the load-aware budget, which also trims the batch's trees to what pays at this batch
    size. Returns each prompt's generated token ids."""
    from specdec.adaptive import AdaptiveConfig, SpeculationController
    from specdec.load_aware import LoadAwareBudget, LoadAwareConfig, draft_depth

    budget = LoadAwareBudget(LoadAwareConfig(enabled=load_aware))
    pool = BatchCache(engine.runner)
    queue = list(enumerate(prompts))
    active: list[tuple[str, Sequence, object, SpeculationController]] = []
    outputs: dict[str, list[int]] = {}
    while queue or active:
        while queue and len(active) < max_batch:
            index, prompt = queue.pop(0)
            seq = Sequence(engine.runner, engine.encode(prompt, chat), params, engine.tokenizer, engine.eos_ids)
            session = engine.drafter.new_session() if engine.drafter is not None else None
            controller = SpeculationController(AdaptiveConfig(engine.config.num_speculative_tokens,
                                                              engine.config.adaptive))
            active.append((str(index), seq, session, controller))
            budget.add(str(index))
        keys, trees = [a[0] for a in active], []
        start = time.perf_counter()
        for key, seq, session, controller in active:
            depth = draft_depth(budget.hint(key), controller.num_tokens(), engine.config.num_speculative_tokens)
            k = min(depth if session is not None else 0, seq.num_remaining - 1)
            trees.append(session.propose(seq.context, k, seq.params, seq.generator) if k > 0 else DraftTree.empty())
        trees = budget.allocate(keys, trees)
        verify_start = time.perf_counter()
        results = step_batch(engine.runner, [a[1] for a in active], trees, pool)
        budget.record(keys, trees, results, time.perf_counter() - verify_start)
        step_s = time.perf_counter() - start
        for (key, seq, session, controller), step in zip(active, results):
            controller.record(step.depth, min(step.num_accepted, step.depth), step_s)
            if seq.finish_reason is not None:
                outputs[key] = list(seq.generated_ids)
                budget.remove(key)
                if hasattr(session, "close"):  # drafters that learn from finished generations (suffix)
                    session.close(seq.context, len(seq.prompt_ids))
        active = [a for a in active if a[1].finish_reason is None]
    return [outputs[str(i)] for i in range(len(prompts))]
