"""`specdec train draft|medusa|eagle|eagle3`: train a drafter for a target on offline text, seeded and time-boxed.

The target's features are computed once into the cache (--cache) and every recipe reuses them.
Output dir: weights (bf16 safetensors), loss.png, recipe.json (config, command, steps, held-out
figures) and a README.md. A run stopped by --minutes records its step count: `--steps N` repeats it.
eagle3 reads its own cache of fused low/middle/high features (specdec.training.fused) and resumes
from out/train_state.pt with --resume (optimizer, step, data position kept).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RECIPES = ("draft", "medusa", "eagle", "eagle3")
DEFAULT_SHARDS = "10-19:256:24"  # 2,560 prompts + 240 passages, 516k tokens; ~4.3 min a shard on 2 cores
# eagle3: other prompt seeds (no overlap with the older heads' text); odd seeds take their documentation
# passages from installed packages (numpy, sympy, networkx, ...), even ones from the stdlib
EAGLE3_SHARDS = "20-39:256:24"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a drafter (distilled draft model, Medusa heads, EAGLE head)")
    p.add_argument("recipe", choices=RECIPES)
    p.add_argument("--target", default=None, help="target checkpoint dir (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--out", default=None, help="output dir (default: ./specdec-<recipe>)")
    p.add_argument("--minutes", type=float, default=10.0, help="optimisation time budget")
    p.add_argument("--steps", type=int, default=0, help="exactly N steps instead of a time budget (reproducible)")
    p.add_argument("--cache", default=None, help="feature cache root (default: $SPECDEC_CACHE or ~/.cache/specdec)")
    p.add_argument("--resume", action="store_true", help="eagle3: continue from OUT/train_state.pt")
    p.add_argument("--lr-schedule", choices=("constant", "cosine"), default="constant",
                   help="eagle3: constant after warm-up, or cosine decay to 5%% of the peak over this sitting's "
                        "budget (for the sitting that ends a run)")
    p.add_argument("--lr", type=float, default=None,
                   help="eagle3: peak learning rate (default: the recipe's 8e-4); a lower one suits a short sitting "
                        "resumed from a run whose rate had already decayed")
    p.add_argument("--cached-only", action="store_true",
                   help="eagle3: train on the shards already cached, skipping (not generating) the others")
    p.add_argument("--shards", default=None,
                   help="feature-cache shards SEED:PROMPTS:PASSAGES (or FIRST-LAST:PROMPTS:PASSAGES for a range of "
                        "seeds), comma-separated: prompts the target answers (its greedy answers are the training "
                        f"text) and raw stdlib passages, per prompt seed; each shard is cached on its own "
                        f"(default {DEFAULT_SHARDS}; eagle3: {EAGLE3_SHARDS})")
    p.add_argument("--max-new-tokens", type=int, default=128, help="length of the target's answers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1 is fastest on a busy 2-core machine: no spin-waiting)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from specdec.errors import InvalidArgument
    from specdec.models.embedded import cache_dir
    from specdec.models.loader import load_model
    from specdec.training.common import Budget
    from specdec.training.features import build_or_load, concat

    if args.minutes <= 0 or args.steps < 0:
        raise InvalidArgument("--minutes must be > 0 and --steps >= 0")
    if (args.resume or args.cached_only or args.lr_schedule != "constant" or args.lr is not None) \
            and args.recipe != "eagle3":
        raise InvalidArgument("--resume, --cached-only, --lr-schedule and --lr apply to the eagle3 recipe only")
    if args.lr is not None and not args.lr > 0:
        raise InvalidArgument("--lr must be > 0")
    if args.max_new_tokens <= 0:
        raise InvalidArgument("--max-new-tokens must be > 0")
    torch.set_num_threads(max(args.threads, 1))
    torch.manual_seed(args.seed)
    target = load_model(args.target, torch.float32)
    if target.tokenizer is None:
        raise InvalidArgument("training needs a target with a tokenizer (its chat template writes the prompts)")
    root = Path(args.cache) if args.cache else cache_dir()
    if args.recipe == "eagle3":
        from specdec.commands.train_eagle3 import run_eagle3

        return run_eagle3(args, target, root)
    shards = [shard for text in (args.shards or DEFAULT_SHARDS).split(",")
              for shard in parse_shards(text, args.max_new_tokens)]
    fs = concat([build_or_load(target, shard, root) for shard in shards])
    out = Path(args.out or f"specdec-{args.recipe}")
    budget = Budget(minutes=args.minutes, max_steps=args.steps)
    extra = {"target": str(target.path), "feature_shards": [shard.__dict__ for shard in shards],
             "num_feature_tokens": len(fs.ids)}
    summary = train(args.recipe, fs, target, budget, out, args.seed, extra)
    write_readme(out, args.recipe, summary)
    print(json.dumps({"out": str(out), **summary}, indent=1, default=str))
    return 0


def parse_shards(text: str, max_new_tokens: int) -> list:
    """FIRST-LAST:PROMPTS:PASSAGES -> one shard per seed in [FIRST, LAST]; SEED:PROMPTS:PASSAGES -> one."""
    from specdec.errors import InvalidArgument

    seeds, _, rest = text.partition(":")
    if "-" not in seeds:
        return [parse_shard(text, max_new_tokens)]
    try:
        first, last = (int(x) for x in seeds.split("-"))
    except ValueError:
        raise InvalidArgument(f"--shards takes FIRST-LAST:PROMPTS:PASSAGES items, got {text!r}") from None
    if last < first:
        raise InvalidArgument(f"--shards seed range {seeds!r} is empty")
    return [parse_shard(f"{seed}:{rest}", max_new_tokens) for seed in range(first, last + 1)]


def parse_shard(text: str, max_new_tokens: int):
    from specdec.errors import InvalidArgument
    from specdec.training.features import FeatureCacheConfig

    try:
        seed, prompts, passages = (int(x) for x in text.split(":"))
    except ValueError:
        raise InvalidArgument(f"--shards takes SEED:PROMPTS:PASSAGES items, got {text!r}") from None
    return FeatureCacheConfig(num_prompts=prompts, max_new_tokens=max_new_tokens, num_passages=passages, seed=seed)


def train(recipe: str, fs, target, budget, out: Path, seed: int, extra: dict) -> dict:
    if recipe == "medusa":
        from specdec.training.medusa import MedusaRecipe, train_medusa

        return train_medusa(fs, target.model.get_output_embeddings().weight.detach(), MedusaRecipe(seed=seed),
                            budget, out, extra)
    if recipe == "eagle":
        from specdec.training.eagle import EagleRecipe, train_eagle

        return train_eagle(fs, target.model, EagleRecipe(seed=seed), budget, out, extra)
    from specdec.training.draft import DraftRecipe, train_draft

    return train_draft(fs, target, DraftRecipe(seed=seed), budget, out, extra)


def peak_of(sitting: dict) -> str:
    """' from <peak>' for a sitting that recorded its peak learning rate (sittings of older runs did not)."""
    return f" from {sitting['peak_lr']:g}" if "peak_lr" in sitting else ""


def write_readme(out: Path, recipe: str, summary: dict) -> None:
    record = json.loads((out / "recipe.json").read_text())
    history = summary.get("sitting_history") or []
    if len(history) > 1:  # a resumed run: each sitting's command, steps and learning-rate schedule
        made = ["Trained in sittings:", ""] + [f"{h['sitting']}. `{h['command']}`: {h['steps']} steps, {h['minutes']} min, "
                                              f"{h['lr_schedule']} learning rate{peak_of(h)}, {h['num_train_tokens']} tokens"
                                              for h in history]
    else:
        made = [f"Trained by: `{record.get('command') or 'specdec train ' + recipe}`", "",
                f"Reproduce exactly: `specdec train {recipe} --steps {summary['steps']} --out DIR` "
                "(same seed, same feature cache)."]
    lines = [f"# {recipe} drafter", "", *made, "", "Loss curve: loss.png. Full recipe and results: recipe.json.", "",
             "| result | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in summary.items() if not isinstance(v, list)]
    (out / "README.md").write_text("\n".join(lines) + "\n")
