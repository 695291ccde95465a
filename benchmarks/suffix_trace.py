"""Where the suffix drafter drafts, and where its drafts fail: a per-step trace on the workload prompts.

    PYTHONPATH=. python benchmarks/suffix_trace.py [--workloads json ...] [--max-new-tokens 160]
        [--depth 8] [--adaptive] [--steps] [--config '{"spec_factor": 1.0}']

Greedy decoding is deterministic, so the target's answer to each prompt is computed once (plain
decoding, cached under benchmarks/out/suffix_trace/) and the drafter is then replayed against it
offline: at every step it proposes for the committed context, the accepted length is the longest
path of its tree that the answer continues, and the step commits that plus one token, exactly as a
greedy verify would. So a change to the drafter is measured in seconds, without the target. The
replay drafts at a fixed depth every step, or with --adaptive asks the engine's speculation policy
(one per prompt, as the engine does) how deep to draft, feeding it step times from a fixed cost
model (seconds per verify forward against its rows, --row-costs) instead of measured ones: the
bench's adaptive choice without its timing noise. The store learns from the prompts in the bench's
order. Creative writing (sampled) is skipped.

Prints per prompt: tau, the share of steps that drafted, the median time of a propose, and with --steps one line per step: the
match length in the session's own trie and in the global store, the draft chosen (its source, nodes,
depth) and the tokens accepted, beside the text of the answer at that point.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

from specdec.core.tree import node_depths
from specdec.core.types import SamplingParams
from specdec.drafters.suffix import SuffixConfig, SuffixDrafter
from specdec.errors import InvalidArgument
from specdec.policy import CostTable, PolicyConfig, SpeculationPolicy

# A verify forward's seconds against its rows (root + nodes), relative to a one-row forward: float32
# on this 2-core AVX-512 CPU, as README's forward-cost goals measured it (8 rows ~1.1x, 16 rows ~1.5x).
ROW_COSTS = "1:1.0,9:1.1,17:1.55,33:2.6"

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "benchmarks" / "out" / "suffix_trace"


def plain_answers(prompts, max_new_tokens: int) -> tuple[list[list[int]], list[list[int]], object]:
    """(prompt ids, greedy answer ids) per prompt, and the tokenizer; answers cached by prompt."""
    from transformers.utils import logging as hf_logging

    from specdec.engine import Engine
    from specdec.models.loader import load_model, pick_dtype

    hf_logging.set_verbosity_error()
    CACHE.mkdir(parents=True, exist_ok=True)
    engine = Engine(load_model(None, pick_dtype("float32")), None)
    prompt_ids, answers = [], []
    from tqdm import tqdm

    for prompt in tqdm(prompts, desc="plain answers", unit="prompt", leave=False):
        ids = engine.encode(prompt.chat(), chat=True)
        key = hashlib.sha256(json.dumps([ids, max_new_tokens]).encode()).hexdigest()[:16]
        path = CACHE / f"{prompt.prompt_id}-{key}.json"
        if not path.exists():
            out = engine.generate(ids, SamplingParams(max_new_tokens=max_new_tokens))
            path.write_text(json.dumps(out.token_ids))
        prompt_ids.append(ids)
        answers.append(json.loads(path.read_text()))
    return prompt_ids, answers, engine.tokenizer


def accepted_length(token_ids, parent_ids, answer: list[int]) -> int:
    """The longest root path of the tree (token ids, parent ids) that `answer` starts with."""
    depth_ok = {-1: 0}  # node -> matched depth, only for nodes on a path the answer follows
    best = 0
    for node, (token, parent) in enumerate(zip(token_ids, parent_ids)):
        if parent in depth_ok:
            d = depth_ok[parent]
            if d < len(answer) and answer[d] == token:
                depth_ok[node] = d + 1
                best = max(best, d + 1)
    return best


def _tree_depth(parent_ids) -> int:
    return max(node_depths(parent_ids))


def row_costs(text: str) -> CostTable:
    """'rows:seconds,...' as a CostTable (interpolated between the given row counts)."""
    table = CostTable(decay=1.0)
    for item in text.split(","):
        rows, seconds = item.split(":")
        if int(rows) < 1 or float(seconds) <= 0:
            raise ValueError(f"--row-costs: need rows >= 1 and seconds > 0, got {item!r}")
        table.means[int(rows)] = float(seconds)
    return table


def replay(drafter: SuffixDrafter, prompt_ids: list[int], answer: list[int], depth: int, trace=None,
           costs: CostTable | None = None, earlier: SpeculationPolicy | None = None) -> dict:
    """Decode `answer` again with drafts from `drafter`; returns the step counts (and the policy).
    costs: replay the adaptive policy with these verify costs (None: draft `depth` deep every step),
    starting, like Engine.stream, from the `earlier` generation's policy."""
    session = drafter.new_session()
    params = SamplingParams()
    policy = None
    if costs is not None:  # a policy per generation that continues the last one, as Engine.stream makes them
        policy = SpeculationPolicy(PolicyConfig(max_depth=depth, adaptive=True, load_aware=False))
        if earlier is not None:
            policy.continue_from(earlier)
        policy.add("0")
    done = steps = drafted = accepted = num_nodes = 0
    cost = 0.0  # with costs: the modelled seconds of every step
    propose_s: list[float] = []  # per step, the first one (reading the whole prompt) included
    while done < len(answer):
        context = prompt_ids + answer[:done]
        limit = min(depth, len(answer) - done - 1)
        budget = policy.plan("0", limit, scored=getattr(session, "scores_nodes", False)) if policy else None
        if budget is not None:
            limit = budget.depth
        start = time.perf_counter()
        tree = session.propose(context, limit, params, None,
                               max_nodes=budget.max_nodes if budget else None) if limit > 0 else None
        propose_s.append(time.perf_counter() - start)
        if policy is not None and tree is not None:  # what the step verifies (the engine's allocate)
            (tree,) = policy.allocate(["0"], [tree], [False])
        n = 0
        if tree is not None and tree.num_nodes:
            drafted += 1
            num_nodes += tree.num_nodes
            n = accepted_length(tree.token_ids, tree.parent_ids, answer[done:])
            accepted += n
        if policy is not None:
            nodes = tree.num_nodes if tree is not None else 0
            step_s = costs.estimate(nodes + 1)
            policy.observe("0", _tree_depth(tree.parent_ids) if nodes else 0, n, step_s, tree.scores if nodes else None,
                           tree.parent_ids if nodes else None)
            cost += step_s
        if trace is not None:
            trace(session, context, tree, n, done)
        done += n + 1
        steps += 1
    session.close(prompt_ids + answer, len(prompt_ids))
    if policy is not None:
        policy.remove("0")
    return {"tokens": len(answer), "steps": steps, "drafted": drafted, "accepted": accepted, "nodes": num_nodes,
            "propose_s": sorted(propose_s)[len(propose_s) // 2], "policy": policy, "cost": cost}


def main() -> None:
    from specdec.bench.workloads import DEFAULT_DIR, load_workloads

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", nargs="*", default=None, help="workload names (default: every greedy one)")
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--depth", type=int, default=None,
                   help="the draft depth (with --adaptive: the most; default: the drafter's own, as in the engine)")
    p.add_argument("--adaptive", action="store_true", help="the policy's adaptive depth, timed by --row-costs")
    p.add_argument("--row-costs", default=ROW_COSTS, help=f"rows:seconds,... of a verify forward (default {ROW_COSTS})")
    p.add_argument("--steps", action="store_true", help="print every step of the prompts shown")
    p.add_argument("--show", nargs="*", default=None, help="with --steps: only these prompt ids")
    p.add_argument("--config", default="{}", help="SuffixConfig fields as JSON")
    args = p.parse_args()
    if args.max_new_tokens < 1 or (args.depth is not None and args.depth < 1):
        p.error("--max-new-tokens and --depth must be >= 1")
    try:
        config = SuffixConfig(**json.loads(args.config))
        costs = row_costs(args.row_costs) if args.adaptive else None
        prompts = [q for q in load_workloads(REPO / DEFAULT_DIR, tuple(args.workloads) if args.workloads else None)
                   if q.temperature == 0]
    except (TypeError, ValueError, InvalidArgument) as exc:
        p.error(str(exc))  # one line, exit code 2
    prompt_ids, answers, tokenizer = plain_answers(prompts, args.max_new_tokens)
    drafter = SuffixDrafter(config)
    depth = args.depth or drafter.default_depth
    totals: dict[str, dict] = {}
    policy = None
    for prompt, ids, answer in zip(prompts, prompt_ids, answers):
        show = args.steps and (args.show is None or prompt.prompt_id in args.show)

        def trace(session, context, tree, n, done):
            info = session.last_choice if hasattr(session, "last_choice") else ""
            nodes = tree.num_nodes if tree is not None else 0
            depth = _tree_depth(tree.parent_ids) if nodes else 0
            text = tokenizer.decode(answer[done:done + n + 1])
            print(f"  @{done:3d} {info!s:28} nodes {nodes:2d} depth {depth} accepted {n}  {text!r}")

        if show:
            print(f"== {prompt.prompt_id}")
        r = replay(drafter, ids, answer, depth, trace if show else None, costs, policy)
        policy = r["policy"]
        print(f"{prompt.workload:14} {prompt.prompt_id:28} tau {r['tokens'] / r['steps']:.2f}  "
              f"drafted {r['drafted'] / r['steps']:.0%}  accepted/drafted step {r['accepted'] / max(r['drafted'], 1):.2f}  "
              f"nodes/draft {r['nodes'] / max(r['drafted'], 1):.1f}  propose {r['propose_s'] * 1e6:.0f} us (median step)")
        t = totals.setdefault(prompt.workload, {"tokens": 0, "steps": 0, "cost": 0.0})
        t["tokens"] += r["tokens"]
        t["steps"] += r["steps"]
        t["cost"] += r["cost"]
    print("tau per workload: " + ", ".join(f"{w} {t['tokens'] / t['steps']:.2f}" for w, t in totals.items()))
    if costs is not None:  # tokens per modelled second over plain decoding's (one-row forwards)
        plain = costs.estimate(1)
        print("modelled speedup: " + ", ".join(f"{w} {t['tokens'] * plain / t['cost']:.2f}x" for w, t in totals.items()))


if __name__ == "__main__":
    main()
