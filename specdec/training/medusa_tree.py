"""Rank a Medusa checkpoint's tree paths anew on fresh text, heads unchanged.

    python -m specdec.training.medusa_tree [--checkpoint DIR] [--seeds 97] [--num-paths 48]

Why: a checkpoint's tree is the list of path tuples its heads are most often right on (with greedy
verification at most one node per depth is right, so a tree's expected accepted length is the sum
of its paths' P(path right), and adding paths in that order is the best tree for every size). Since
the engine's policy cuts each step's scored tree to the nodes worth their measured verify cost, the
shipped list should hold every path that may pay on some machine, ranked, not one size chosen for one
CPU's float32 costs. This measures the ranking on feature shards of seeds the heads never trained on
(the target's own greedy answers to the training prompt families; never Spec-Bench or the workload
prompts), rewrites the config's tree_paths and records the measurement in recipe.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from specdec.errors import InvalidArgument

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints" / "medusa"


def trained_seeds(record) -> set[int]:
    """Feature-shard seeds a checkpoint's recipe names anywhere (its shards, every sitting, the runs it
    was initialised from): the text its heads may have trained on."""
    seeds: set[int] = set()
    if isinstance(record, dict):
        for key, value in record.items():
            if key == "feature_seeds" and isinstance(value, list):
                seeds.update(s for s in value if isinstance(s, int))
            elif key == "feature_shards" and isinstance(value, list):
                seeds.update(s["seed"] for s in value if isinstance(s, dict) and isinstance(s.get("seed"), int))
            else:
                seeds |= trained_seeds(value)
    elif isinstance(record, list):
        for value in record:
            seeds |= trained_seeds(value)
    return seeds


def rank_paths(checkpoint: Path, fs, head_weight_full, num_paths: int, max_rank: int):
    """(paths best first, P(path right) each, top-1 per head) of the checkpoint's heads on fs."""
    import torch

    from specdec.drafters.medusa import load_medusa
    from specdec.training.medusa import MedusaRecipe, choose_tree

    heads, vocab_ids, config = load_medusa(checkpoint, torch.float32)
    recipe = replace(MedusaRecipe(), num_heads=config.num_heads, num_tree_nodes=num_paths, max_rank=max_rank,
                     verify_cost_per_node=0.0)
    return choose_tree(heads, fs, vocab_ids, head_weight_full[vocab_ids].float(), recipe)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default=str(SHIPPED), help="Medusa checkpoint DIR, rewritten in place")
    p.add_argument("--seeds", default="97", help="feature-shard seeds, comma-separated (not the training ones)")
    p.add_argument("--num-prompts", type=int, default=128, help="prompts per shard")
    p.add_argument("--num-paths", type=int, default=48)
    p.add_argument("--max-rank", type=int, default=10, help="candidates per head a path may use")
    p.add_argument("--target", default=None, help="the heads' target checkpoint (default: the embedded SmolLM2)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    try:
        checkpoint = Path(args.checkpoint)
        config_path = checkpoint / "medusa_config.json"
        if not config_path.is_file():
            raise InvalidArgument(f"--checkpoint {args.checkpoint!r}: no medusa_config.json there")
        seeds = [int(s) for s in args.seeds.split(",")]
        if args.num_paths < 1 or args.max_rank < 1 or args.num_prompts < 1:
            raise InvalidArgument("--num-paths, --max-rank and --num-prompts must be >= 1")
        recipe_path = checkpoint / "recipe.json"
        recipe = json.loads(recipe_path.read_text()) if recipe_path.is_file() else {}
        if seen := sorted(set(seeds) & trained_seeds(recipe)):
            raise InvalidArgument(f"--seeds {seen} are shards the heads were trained on: rank on unseen text")
    except (ValueError, InvalidArgument) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch

    from specdec.models.embedded import cache_dir
    from specdec.models.loader import load_model
    from specdec.training.features import FeatureCacheConfig, build_or_load, concat

    torch.set_num_threads(max(args.threads, 1))
    target = load_model(args.target, torch.float32)
    config = json.loads(config_path.read_text())
    head_weight = target.model.get_output_embeddings().weight.detach()
    if (config["target_vocab_size"], config["hidden_size"]) != tuple(head_weight.shape):
        print(f"error: the heads are for a target with vocabulary {config['target_vocab_size']} and hidden size "
              f"{config['hidden_size']}, not {tuple(head_weight.shape)}: pass its --target", file=sys.stderr)
        return 2
    shards = [FeatureCacheConfig(seed=s, num_prompts=args.num_prompts, num_passages=0, bf16=True) for s in seeds]
    fs = concat([build_or_load(target, shard, cache_dir()) for shard in shards])
    paths, probs, top1 = rank_paths(checkpoint, fs, head_weight, args.num_paths, args.max_rank)
    before = {tuple(p) for p in config["tree_paths"]}
    measured = dict(zip(paths, probs))
    config["tree_paths"] = [list(path) for path in paths]
    config_path.write_text(json.dumps(config))
    record = {"command": "python -m specdec.training.medusa_tree " + " ".join(argv or sys.argv[1:]),
              "seeds": seeds, "num_tokens": len(fs.ids), "top1_per_head": top1,
              "expected_accepted_per_step": {"before": round(sum(measured.get(p, 0.0) for p in before), 4),
                                             "after": round(sum(probs), 4)},
              "num_paths": {"before": len(before), "after": len(paths)},
              "tree_path_probs": [round(q, 4) for q in probs]}
    recipe.setdefault("tree_rankings", []).append(record)
    recipe_path.write_text(json.dumps(recipe, indent=2))
    print(json.dumps({k: v for k, v in record.items() if k != "tree_path_probs"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
