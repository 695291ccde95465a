"""A verify step's input tensors: token ids, the additive attention mask and positions.

Shapes (specdec.step): ids [B, N], bias [B, 1, N, L + N], positions [B, N], N the most rows (root +
nodes) of any sequence, L the longest cache. One sequence (the one-user step) takes a short path:
its tree's part of the mask and its depths depend on the tree's shape alone, which a static drafter
(Medusa) repeats step after step, so they are built once per shape and each step only places them
after the cache. At one user the batched layout (~20 small tensor ops) cost 0.23-0.26 ms of a hybrid
step, the short path (four) 0.09-0.10 ms (SmolLM2-135M bf16, 2 threads, 64-token chat answers). Both
give the same tensors for one sequence (tests/test_step_pack.py).
"""
from __future__ import annotations

from functools import lru_cache

import torch

from specdec.core.tree import TreeLayout, tree_layout
from specdec.models.runner import ModelRunner


def causal_runs(runner: ModelRunner, cache, layouts: list[TreeLayout]) -> bool:
    """Whether this step's mask is plain causal attention and the forward can take it as None: one
    sequence whose draft is a chain (or nothing: plain decoding), on the lean forward, whose causal
    rule (row i sees the cache and rows <= i) hides exactly the keys the additive mask would. Building
    the [1, 1, N, L + N] mask cost ~0.1 ms of a ~9 ms plain step."""
    if len(layouts) != 1 or runner.lean is None or not runner.lean.runs(cache, layouts[0].num_rows):
        return False
    if runner.graphs is not None and runner.graphs.active:
        return False
    return layouts[0].is_chain  # node i's parent is node i - 1 (an empty tree too)


@lru_cache(maxsize=256)
def tree_part(parent_ids: tuple[int, ...], dtype: torch.dtype, device: torch.device
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """One tree shape's (bias [N, N]: 0 where a row sees a row, else dtype's min; depths [1, N] long),
    on `device`. Shared by every step of that shape: read only."""
    layout = tree_layout(parent_ids)
    bias = torch.zeros(layout.num_rows, layout.num_rows, dtype=dtype, device="cpu")
    bias.masked_fill_(~layout.mask, torch.finfo(dtype).min)
    depths = torch.tensor([layout.depths], dtype=torch.long, device="cpu")
    return bias.to(device), depths.to(device)


def pack(runner: ModelRunner, seqs: list, trees: list, layouts: list[TreeLayout],
         cache_lens: list[int], causal: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """ids [B, N], bias [B, 1, N, L + N] (None where `causal`: see causal_runs), positions [B, N] for one
    padded verify forward, on the model's device."""
    if len(seqs) == 1:
        return _pack_one(runner, seqs[0], trees[0], cache_lens[0], causal)
    return _pack_batch(runner, seqs, trees, layouts, cache_lens)


def _pack_one(runner: ModelRunner, seq, draft, length: int, causal: bool
              ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """One sequence: no padding rows, every row sees the whole cache [0, length) and, among its tree's
    columns, what tree_part says."""
    device = runner.device
    ids = torch.tensor([[seq.context[-1], *draft.token_ids]], device=device)  # [1, N]
    if causal:
        return ids, None, torch.arange(length, length + ids.shape[1], device=device)[None, :]
    tree_bias, depths = tree_part(draft.parent_ids, runner.dtype, torch.device(device))  # [N, N], [1, N]
    rows = tree_bias.shape[0]
    bias = torch.zeros(1, 1, rows, length + rows, dtype=runner.dtype, device=device)
    bias[0, 0, :, length:] = tree_bias
    return ids, bias, depths + length


def _pack_batch(runner: ModelRunner, seqs: list, trees: list, layouts: list[TreeLayout],
                cache_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Several sequences, padded. The per-sequence pieces (tokens, depths, tree masks: host data) are
    laid out on the host and copied over once; the cache part of the mask is made on the device."""
    num_rows = [layout.num_rows for layout in layouts]
    max_len, max_rows, batch = max(cache_lens), max(num_rows), len(seqs)
    ids = torch.zeros(batch, max_rows, dtype=torch.long, device="cpu")
    depths = torch.zeros(batch, max_rows, dtype=torch.long, device="cpu")
    tree = torch.eye(max_rows, dtype=torch.bool, device="cpu").repeat(batch, 1, 1)  # [B, N, N] padding: itself
    for i, (seq, draft, layout) in enumerate(zip(seqs, trees, layouts)):
        n = num_rows[i]
        ids[i, :n] = torch.tensor([seq.context[-1], *draft.token_ids], device="cpu")
        depths[i, :n] = torch.tensor(layout.depths, device="cpu")
        tree[i, :n, :n] = layout.mask
    device = runner.device
    lens = torch.tensor(cache_lens, dtype=torch.long, device="cpu")
    real = torch.arange(max_rows, device="cpu")[None, :] < torch.tensor(num_rows, device="cpu")[:, None]  # [B, N]
    ids, depths, tree, lens, real = (t.to(device, non_blocking=True) for t in (ids, depths, tree, lens, real))
    positions = depths + lens[:, None]  # padding rows: at the sequence's length, depth 0
    sees_cache = torch.arange(max_len, device=device)[None, :] < lens[:, None]  # [B, L]
    allowed = torch.cat([sees_cache[:, None, :] & real[:, :, None], tree], dim=2)  # [B, N, L + N]
    bias = torch.zeros(batch, 1, max_rows, max_len + max_rows, dtype=runner.dtype, device=device)
    bias.masked_fill_(~allowed[:, None], torch.finfo(runner.dtype).min)
    return ids, bias, positions
