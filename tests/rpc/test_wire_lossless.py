"""Sampling stays lossless over the wire: a drafter that draws from its top-N truncated q and sends
exactly that (sparse) q gets tokens distributed as the target's p; one that sends its full q while
drawing from the truncation does not (the broken variant must fail the same check)."""
import torch

from specdec.core.sampling import warp
from specdec.core.tree import DraftTree, tree_layout
from specdec.core.types import SamplingParams
from specdec.core.verify import verify_sampling
from specdec.drafters.draft_model import pick_children
from specdec.rpc.trees import tree_from_pb, tree_to_pb

VOCAB, DRAWS, TOP_N = 8, 6000, 3  # seeded: the outcome is fixed; bounds hold with margin


def emitted_distribution(send_truncated: bool) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=1.0)
    target_logits = torch.randn(2, VOCAB, generator=generator) * 1.5  # rows: root, node 0
    draft_logits = torch.randn(VOCAB, generator=generator) * 1.5
    p = warp(target_logits, params)  # [2, vocab]
    full_q = warp(draft_logits, params)
    layout = tree_layout((-1,))
    counts = torch.zeros(VOCAB)
    for _ in range(DRAWS):
        (token, q, _), = pick_children(draft_logits, 1, params, generator, top_n=TOP_N)
        sent = q if send_truncated else full_q
        tree = tree_from_pb(tree_to_pb(DraftTree((token,), (-1,), sent.unsqueeze(0))), VOCAB, 4)
        first = verify_sampling(tree, layout, p, generator).token_ids[0]
        counts[first] += 1
    return counts / DRAWS, p[0]


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def test_truncated_q_sent_exactly_is_lossless():
    empirical, p = emitted_distribution(send_truncated=True)
    assert total_variation(empirical, p) < 0.03


def test_sending_a_q_other_than_the_one_sampled_from_is_caught():
    empirical, p = emitted_distribution(send_truncated=False)
    assert total_variation(empirical, p) > 0.06
