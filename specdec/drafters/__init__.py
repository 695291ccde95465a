"""Independent drafters behind one interface, and the factory the engine and CLI use."""
from __future__ import annotations

import json

from specdec.errors import InvalidArgument

DRAFTERS = ("none", "ngram", "suffix", "draft", "medusa", "eagle", "eagle3", "hybrid")
SUFFIX_OPTIONS = {"max_depth", "spec_factor", "min_token_prob", "carry_miss", "num_nodes", "global_tokens"}

# Options each drafter accepts through Engine.from_pretrained(**drafter_options).
DRAFTER_OPTIONS = {
    "none": set(),
    "ngram": {"max_ngram", "min_ngram", "num_branches", "num_nodes"},
    "suffix": SUFFIX_OPTIONS,
    "draft": {"tree_width", "q_top_n"},
    "medusa": {"num_nodes"},
    "eagle": {"num_nodes", "top_k", "depth", "min_path_prob"},
    "eagle3": {"num_nodes", "top_k", "depth", "min_path_prob"},
    # suffix decoding's options, and specdec.drafters.hybrid.HybridConfig's
    "hybrid": SUFFIX_OPTIONS | {"mode", "threshold", "medusa_nodes"},
}
TRAINED_DRAFTERS = ("draft", "medusa", "eagle", "eagle3", "hybrid")  # take a trained checkpoint dir (draft=PATH)
SELF_DRAFTERS = ("medusa", "eagle", "eagle3", "hybrid")  # read the target's features: they run beside the target
# The trained checkpoint a drafter loads, where it is another drafter's (hybrid: the Medusa heads).
CHECKPOINT_OF = {"hybrid": "medusa"}


def parse_options(name: str, options) -> dict:
    """A drafter's options as a deployment gives them (a mapping, or its JSON text; "" = none), checked
    against what `name` takes: the same refusal build_drafter gives, but when the config is read, before
    any weight loads."""
    if isinstance(options, str):
        try:
            options = json.loads(options) if options.strip() else {}
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"drafter_options must be a JSON object, got {options!r} ({exc.msg})") from None
    if not isinstance(options, dict):
        raise InvalidArgument(f"drafter_options must be a mapping of option names to values, got {options!r}")
    if name not in DRAFTER_OPTIONS:
        raise InvalidArgument(f"unknown drafter {name!r}; choose one of {', '.join(DRAFTERS)}")
    unknown = set(options) - DRAFTER_OPTIONS[name]
    if unknown:
        valid = ", ".join(sorted(DRAFTER_OPTIONS[name])) or "none"
        raise InvalidArgument(f"drafter {name!r} takes no option {', '.join(sorted(unknown))} (valid: {valid})")
    return options


def checkpoint_name(drafter: str) -> str:
    """Which trained drafter's checkpoint `drafter` loads (shipped under specdec/checkpoints/<name>)."""
    return CHECKPOINT_OF.get(drafter, drafter)
# draft="random" with drafter "draft": an untrained 1-layer stand-in sharing the target's vocabulary.
# It accepts almost nothing; tests and overhead measurements ask for it by this name, nobody gets it by default.
RANDOM_DRAFT = "random"


def build_drafter(name: str, target, draft_path, options: dict, dtype, runner_config=None):
    """A Drafter for `name` (None for plain decoding). target: the LoadedModel being served.
    runner_config: how a draft model's forwards run, and which kernel self-drafting heads run on
    (specdec.models.runner.RunnerConfig; None = default)."""
    options = parse_options(name, options)  # refuses an unknown drafter too
    if draft_path is not None and name not in TRAINED_DRAFTERS:
        raise InvalidArgument(f"a draft checkpoint path was given but drafter is {name!r}; "
                              f"use one of {', '.join(TRAINED_DRAFTERS)}")
    if draft_path == RANDOM_DRAFT and name != "draft":
        raise InvalidArgument(f"draft={RANDOM_DRAFT!r} (an untrained stand-in) exists only for drafter 'draft', "
                              f"not {name!r}")
    if name == "none":
        return None
    if name == "ngram":
        from specdec.drafters.ngram import NgramConfig, NgramDrafter

        return NgramDrafter(NgramConfig(**options))
    if name == "suffix":
        from specdec.drafters.suffix import SuffixConfig, SuffixDrafter

        return SuffixDrafter(SuffixConfig(**options))
    if name == "hybrid":
        from specdec.drafters.hybrid import build_hybrid

        return build_hybrid(target, draft_path, options, runner_config)
    if name in SELF_DRAFTERS:
        from specdec.drafters.trained import build_self_drafter

        return build_self_drafter(name, target, draft_path, options, runner_config)
    from specdec.drafters.draft_model import DraftModelConfig, DraftModelDrafter
    from specdec.drafters.trained import shipped_checkpoint
    from specdec.models.loader import load_model, random_draft_path
    from specdec.models.runner import ModelRunner, RunnerConfig, load_vocab_ids

    if draft_path is None:  # the shipped distilled draft, which exists for the embedded target only
        draft_path = shipped_checkpoint("draft", target)
        if draft_path is None:
            raise InvalidArgument(no_draft_model_reason(target.path))
    elif draft_path == RANDOM_DRAFT:
        draft_path = random_draft_path(target)
    draft = load_model(draft_path, dtype, device=next(target.model.parameters()).device)  # beside the target
    if draft.model.config.vocab_size != target.model.config.vocab_size:
        raise InvalidArgument(f"draft vocabulary ({draft.model.config.vocab_size}) differs from the target's "
                              f"({target.model.config.vocab_size}); the draft must share the target's tokenizer")
    return DraftModelDrafter(ModelRunner(draft.model, load_vocab_ids(draft_path), runner_config or RunnerConfig()),
                             DraftModelConfig(**options))


def no_draft_model_reason(target_path) -> str:
    """Why drafter 'draft' without a checkpoint is refused for a target other than the embedded one."""
    return (f"no trained draft model is shipped for the target {str(target_path)!r}; train one (specdec train draft "
            f"--target PATH --out DIR) and pass draft=DIR, or draft={RANDOM_DRAFT!r} for an untrained stand-in "
            f"(tests only: it accepts almost nothing)")
