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
Padding costs copies of the caches each step; on a CPU that is small next to the weight reads it saves.
"""
from __future__ import annotations

import time

import torch
from transformers import DynamicCache

from specdec.core import kv
from specdec.core.tree import DraftTree, tree_layout
from specdec.models.runner import ModelRunner
from specdec.sequence import Sequence, StepResult


def step_batch(runner: ModelRunner, seqs: list[Sequence], trees: list[DraftTree]) -> list[StepResult]:
    """Verify trees[i] for seqs[i] (all unfinished) in one forward; returns each sequence's StepResult."""
    if len(seqs) == 1:
        return [seqs[0].step(trees[0])]
    start = time.perf_counter()
    layouts = [tree_layout(t.parent_ids) for t in trees]
    cache_lens = [kv.num_cached(s.cache) for s in seqs]
    num_rows = [layout.num_rows for layout in layouts]
    max_len, max_rows, batch = max(cache_lens), max(num_rows), len(seqs)
    cache = _stack_caches(runner, seqs, cache_lens, max_len)
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
    results = []
    for i, (seq, tree, layout) in enumerate(zip(seqs, trees, layouts)):
        result = seq.verify(tree, layout, logits[i])
        keep = list(range(cache_lens[i])) + [max_len + r for r in (0, *result.accepted_rows)]
        seq.cache = _select(runner, cache, i, keep)
        results.append(seq.commit_verified(tree, layout, result, hidden[i, :num_rows[i]], verify_s))
    return results


def _stack_caches(runner: ModelRunner, seqs: list[Sequence], lens: list[int], max_len: int) -> DynamicCache:
    cache = runner.new_cache()
    for layer_idx in range(len(seqs[0].cache.layers)):
        layers = [s.cache.layers[layer_idx] for s in seqs]
        ref = next(layer.keys for layer in layers if layer.keys is not None and layer.keys.numel())
        keys = ref.new_zeros(len(seqs), ref.shape[1], max_len, ref.shape[3])
        values = torch.zeros_like(keys)
        for i, layer in enumerate(layers):
            if lens[i]:
                keys[i, :, :lens[i]] = layer.keys[0]
                values[i, :, :lens[i]] = layer.values[0]
        cache.update(keys, values, layer_idx)
    return cache


def _select(runner: ModelRunner, cache: DynamicCache, row: int, keep: list[int]) -> DynamicCache:
    """Sequence `row`'s entries `keep` (positions in the batched cache) as its own cache."""
    index = torch.tensor(keep, dtype=torch.long)
    out = runner.new_cache()
    for layer_idx, layer in enumerate(cache.layers):
        out.update(layer.keys[row:row + 1].index_select(2, index), layer.values[row:row + 1].index_select(2, index),
                   layer_idx)
    return out


def generate_batch(engine, prompts: list, params, max_batch: int = 8, chat: bool = False,
                   load_aware: bool = True) -> list[list[int]]:
    """Continuous batching in process: up to max_batch sequences step together; a finished sequence
    leaves and the next prompt joins between steps. Each sequence's controller picks its draft depth,
    capped by the load-aware budget, which also trims the batch's trees to what pays at this batch
    size. Returns each prompt's generated token ids."""
    from specdec.adaptive import AdaptiveConfig, SpeculationController
    from specdec.load_aware import LoadAwareBudget, LoadAwareConfig

    budget = LoadAwareBudget(LoadAwareConfig(enabled=load_aware))
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
            k = min(controller.num_tokens() if session is not None else 0, budget.hint(key), seq.num_remaining - 1)
            trees.append(session.propose(seq.context, k, seq.params, seq.generator) if k > 0 else DraftTree.empty())
        trees = budget.allocate(keys, trees)
        verify_start = time.perf_counter()
        results = step_batch(engine.runner, [a[1] for a in active], trees)
        budget.record(keys, trees, results, time.perf_counter() - verify_start)
        step_s = time.perf_counter() - start
        for (key, seq, _, controller), step in zip(active, results):
            controller.record(step.depth, min(step.num_accepted, step.depth), step_s)
            if seq.finish_reason is not None:
                outputs[key] = list(seq.generated_ids)
                budget.remove(key)
        active = [a for a in active if a[1].finish_reason is None]
    return [outputs[str(i)] for i in range(len(prompts))]
