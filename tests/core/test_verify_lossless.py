"""Statistical losslessness of rejection sampling (docs/architecture.md, "The contract").

A synthetic language over a small vocabulary: p(. | prefix) for the target and q(. | prefix) for
the drafter are fixed random distributions per prefix. For each drafting scheme we run many verify
steps and compare the empirical joint distribution of the first two emitted tokens with the exact
p(x1) p(x2 | x1). The statistic is the G-test, G = 2 N KL(empirical || exact), which is chi-square
distributed with (outcomes - 1) degrees of freedom when the sampler is exact. The stated tolerance:
KL <= chi2_{0.999}(df) / (2 N) (df / 2N is the expected KL of exact sampling). Plain sampling passes
the same test, and deliberately broken acceptance rules fail it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

from distribution import g_test_kl
from specdec.core.sampling import warp
from specdec.core.tree import DraftTree, tree_layout
from specdec.core.types import SamplingParams
from specdec.core.verify import VerifyResult, verify_sampling

VOCAB = 6
NUM_DRAWS = 12000


class Language:
    """Cached random conditional logits for target (scale 1.5) and drafter (different seed, scale 1.0).

    Seeded from a CRC-32 of (who, prefix): Python's hash() of a string changes per process
    (PYTHONHASHSEED), which would make every G-test below a different test on every run.
    """

    def __init__(self, params: SamplingParams):
        self.params = params
        self.cache: dict = {}

    def probs(self, who: str, prefix: tuple[int, ...]) -> torch.Tensor:
        key = (who, prefix)
        if key not in self.cache:
            g = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
            logits = torch.randn(VOCAB, generator=g) * (1.5 if who == "p" else 1.0)
            self.cache[key] = warp(logits, self.params)
        return self.cache[key]


def draw_children(q: torch.Tensor, width: int, scheme: str, g: torch.Generator):
    """(token, q row) per child: iid, without replacement, or deterministic top-k (q row None)."""
    if scheme == "topk":
        return [(int(t), None) for t in torch.topk(q, width).indices]
    out = []
    for _ in range(width):
        token = int(torch.multinomial(q, 1, generator=g))
        out.append((token, q))
        if scheme == "norepl":
            q = q.clone()
            q[token] = 0
            q = q / q.sum()
    return out


def build_tree(lang: Language, prefix, scheme: str, width: int, depth: int, g) -> tuple[DraftTree, list]:
    tokens, parents, qs, paths = [], [], [], []
    frontier = [(-1, ())]
    for _ in range(depth):
        nxt = []
        for parent, path in frontier:
            for token, q in draw_children(lang.probs("q", prefix + path), width, scheme, g):
                tokens.append(token)
                parents.append(parent)
                qs.append(q)
                paths.append(path + (token,))
                nxt.append((len(tokens) - 1, path + (token,)))
        frontier = nxt
    q = None if scheme == "topk" else torch.stack(qs)
    return DraftTree(tuple(tokens), tuple(parents), q), paths


def run(params: SamplingParams, scheme: str, width: int, depth: int, verify=verify_sampling, plain=False):
    lang = Language(params)
    g = torch.Generator().manual_seed(1234)
    prefix = (1, 2)
    counts: dict = {}
    for _ in range(NUM_DRAWS):
        if plain:
            t1 = int(torch.multinomial(lang.probs("p", prefix), 1, generator=g))
            emitted = (t1,)
        else:
            tree, paths = build_tree(lang, prefix, scheme, width, depth, g)
            rows = [lang.probs("p", prefix)] + [lang.probs("p", prefix + path) for path in paths]
            emitted = verify(tree, tree_layout(tree.parent_ids), torch.stack(rows), g).token_ids
        if len(emitted) < 2:  # the next step would sample the second token from p
            emitted = emitted + (int(torch.multinomial(lang.probs("p", prefix + emitted[:1]), 1, generator=g)),)
        key = emitted[:2]
        counts[key] = counts.get(key, 0) + 1
    exact = {(a, b): float(lang.probs("p", prefix)[a] * lang.probs("p", prefix + (a,))[b])
             for a in range(VOCAB) for b in range(VOCAB)}
    return g_test_kl(counts, exact, NUM_DRAWS)


CASES = [  # (params, scheme, width, depth)
    (SamplingParams(temperature=1.0), "iid", 1, 3),  # a chain
    (SamplingParams(temperature=1.0), "iid", 2, 2),  # tree, children drawn independently
    (SamplingParams(temperature=1.0), "norepl", 3, 2),  # tree, without replacement (Sequoia)
    (SamplingParams(temperature=1.0), "topk", 2, 2),  # tree, deterministic top-k (EAGLE)
    (SamplingParams(temperature=0.8, top_k=4), "iid", 1, 3),  # top-k warped chain
    (SamplingParams(temperature=1.2, top_p=0.8), "norepl", 2, 2),  # top-p warped tree
]


def _language_in_child(hash_seed: str) -> str:
    code = ("from core.test_verify_lossless import Language; from specdec.core.types import SamplingParams; "
            "lang = Language(SamplingParams(temperature=1.0)); "
            "print([round(float(x), 6) for w in 'pq' for x in lang.probs(w, (1, 2))])")
    tests_dir = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONHASHSEED": hash_seed,
           "PYTHONPATH": os.pathsep.join([str(tests_dir), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=True).stdout


def test_the_language_is_the_same_in_every_process():
    """The statistical tests below are the same test on every run, whatever the string hash seed."""
    assert _language_in_child("1") == _language_in_child("2")


@pytest.mark.parametrize("params, scheme, width, depth", CASES)
def test_speculative_sampling_matches_target(params, scheme, width, depth):
    kl, tolerance = run(params, scheme, width, depth)
    assert kl <= tolerance, f"KL {kl:.5f} > tolerance {tolerance:.5f}"


def test_plain_sampling_passes_same_test():
    kl, tolerance = run(SamplingParams(temperature=1.0), "iid", 1, 1, plain=True)
    assert kl <= tolerance


def verify_resample_from_p(tree, layout, probs, g):
    """Broken: on rejection, samples from p instead of the residual max(0, p - q)."""
    row, accepted = 0, []
    while True:
        p = probs[row]
        for child in layout.children[row]:
            x = tree.token_ids[child - 1]
            q_x = 1.0 if tree.q is None else float(tree.q[child - 1][x])
            if float(torch.rand((), generator=g)) * q_x < float(p[x]):
                accepted.append(child)
                row = child
                break
        else:
            tokens = tuple(tree.token_ids[r - 1] for r in accepted)
            return VerifyResult(tuple(accepted), tokens + (int(torch.multinomial(p, 1, generator=g)),))


def verify_ignore_siblings(tree, layout, probs, g):
    """Broken: keeps the root's p for every sibling instead of the running residual."""
    row, accepted = 0, []
    while True:
        p = probs[row]
        residual = p
        for child in layout.children[row]:
            x = tree.token_ids[child - 1]
            q = None if tree.q is None else tree.q[child - 1]
            q_x = 1.0 if q is None else float(q[x])
            if float(torch.rand((), generator=g)) * q_x < float(p[x]):
                accepted.append(child)
                row = child
                break
            residual = (p - (q if q is not None else torch.nn.functional.one_hot(torch.tensor(x), VOCAB))).clamp_min(0)
        else:
            tokens = tuple(tree.token_ids[r - 1] for r in accepted)
            return VerifyResult(tuple(accepted), tokens + (int(torch.multinomial(residual / residual.sum(), 1,
                                                                                 generator=g)),))


@pytest.mark.parametrize("broken, scheme, width", [
    (verify_resample_from_p, "iid", 1), (verify_ignore_siblings, "norepl", 3)])
def test_broken_acceptance_rule_fails_same_test(broken, scheme, width):
    kl, tolerance = run(SamplingParams(temperature=1.0), scheme, width, 2, verify=broken)
    assert kl > tolerance, f"a broken sampler passed: KL {kl:.5f} <= {tolerance:.5f}"
