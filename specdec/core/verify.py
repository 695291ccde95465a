"""Verification: which draft tokens the target keeps, and the one token it adds.

Glossary (docs/architecture.md, "Words"): a verify step walks the draft tree from the root. At each row it either
*accepts* one child and moves into it, or stops and emits one more token: the *recovered* token,
sampled from the residual distribution after every child was rejected, or, at a leaf, the *bonus*
token sampled from p. One step therefore emits len(accepted) + 1 tokens.

Greedy (temperature 0): a child is accepted iff it equals the target's argmax at its parent row; the
emitted sequence is exactly the target's greedy continuation.

Sampling: children of a row are tried in order against the current residual p (SpecInfer's
multi-draft rule). Child x, drawn from q (its row of `DraftTree.q`), is accepted with probability
min(1, p(x) / q(x)); on rejection p <- norm(max(0, p - q)). Because q is per child, this one rule
covers children drawn independently (equal q rows), without replacement (later rows have earlier
picks zeroed, Sequoia) and deterministically (q = one-hot, so a rejection zeroes p(x), EAGLE). When
every child is rejected the recovered token is drawn from the residual. By induction over rows each
emitted token is distributed exactly as p.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.core.sampling import accept, sample
from specdec.core.tree import DraftTree, TreeLayout


@dataclass(frozen=True)
class VerifyResult:
    accepted_rows: tuple[int, ...]  # verify-input rows along the accepted path (root excluded)
    token_ids: tuple[int, ...]  # emitted tokens: the accepted drafts, then the recovered/bonus token

    @property
    def num_accepted(self) -> int:
        return len(self.accepted_rows)


def verify_greedy(tree: DraftTree, layout: TreeLayout, target_argmax: list[int]) -> VerifyResult:
    """target_argmax: [num_rows] argmax of the target's logits at each verify row."""
    row, accepted = 0, []
    while True:
        wanted = target_argmax[row]
        nxt = next((c for c in layout.children[row] if tree.token_ids[c - 1] == wanted), None)
        if nxt is None:
            tokens = tuple(tree.token_ids[r - 1] for r in accepted) + (wanted,)
            return VerifyResult(tuple(accepted), tokens)
        accepted.append(nxt)
        row = nxt


def verify_sampling(
    tree: DraftTree, layout: TreeLayout, probs: torch.Tensor, generator: torch.Generator | None
) -> VerifyResult:
    """probs: [num_rows, vocab] the target's warped distribution p at each verify row (a tensor, or
    core.sampling.WarpedRows, which warps a row when it is first read)."""
    row, accepted = 0, []
    while True:
        p = probs[row]  # [vocab] current residual, starts as the target's p
        for child in layout.children[row]:
            x = tree.token_ids[child - 1]
            q = None if tree.q is None else tree.q[child - 1]  # [vocab] or one-hot
            q_x = 1.0 if q is None else float(q[x])
            if q_x > 0.0 and accept(float(p[x]), q_x, generator):
                accepted.append(child)
                row = child
                break
            residual = p.clone() if q is None else (p - q).clamp_min_(0.0)
            if q is None:
                residual[x] = 0.0
            total = float(residual.sum())
            if total > 0.0:  # total == 0 means p <= q everywhere: rejection had probability 0
                p = residual / total
        else:
            recovered = sample(p, generator)
            tokens = tuple(tree.token_ids[r - 1] for r in accepted) + (recovered,)
            return VerifyResult(tuple(accepted), tokens)
