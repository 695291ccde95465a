"""`specdec train eagle3`: fused-feature shards of the target's own answers, then the resumable TTT recipe."""
from __future__ import annotations

import json
from pathlib import Path


def eagle3_shards(text: str, max_new_tokens: int) -> list:
    """--shards items (FIRST-LAST:PROMPTS:PASSAGES or SEED:PROMPTS:PASSAGES) as FusedShards; odd seeds take
    documentation from installed packages, even seeds from the stdlib."""
    from specdec.commands.train import parse_shards
    from specdec.training.fused import FusedShard

    shards = [s for item in text.split(",") for s in parse_shards(item, max_new_tokens)]
    return [FusedShard(seed=s.seed, num_prompts=s.num_prompts, max_new_tokens=s.max_new_tokens,
                       num_passages=s.num_passages, source="packages" if s.seed % 2 else "stdlib") for s in shards]


def run_eagle3(args, target, root: Path) -> int:
    from specdec.commands.train import EAGLE3_SHARDS, write_readme
    from specdec.errors import InvalidArgument
    from specdec.training.common import Budget
    from specdec.training.eagle3 import Eagle3Recipe, train_eagle3
    from specdec.training.features import concat
    from specdec.training.fused import build_shard, cached_shards, default_layers

    shards = eagle3_shards(args.shards or EAGLE3_SHARDS, args.max_new_tokens)
    if args.cached_only:
        shards = cached_shards(target, shards, root)
        if not shards:
            raise InvalidArgument(f"--cached-only: none of the shards is cached under {root}")
    layers = default_layers(target.model.config.num_hidden_layers)
    fs = concat([build_shard(target, shard, root) for shard in shards])
    out = Path(args.out or "specdec-eagle3")
    extra = {"target": str(target.path), "feature_shards": [s.__dict__ for s in shards],
             "num_feature_tokens": len(fs.ids), "num_feature_seqs": fs.num_seqs}
    recipe = Eagle3Recipe(seed=args.seed, lr_schedule=args.lr_schedule,
                          **({} if getattr(args, "lr", None) is None else {"lr": args.lr}))
    summary = train_eagle3(fs, target.model, recipe, Budget(args.minutes, args.steps), out,
                           resume=args.resume, extra=extra, feature_layers=layers)
    write_readme(out, "eagle3", summary)
    print(json.dumps({"out": str(out), **summary}, indent=1, default=str))
    return 0
