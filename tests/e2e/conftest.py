"""Fixtures for end-to-end tests: tiny checkpoints, in-process references, real server processes.

Every process is started through specdec.launch (children die with this process) and stopped in
a `finally`, so a failing test never leaves a server behind.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from e2e.harness import always_drafting, running_stack, stack_config
from e2e.tiny import make_noisy_copy, make_tiny_llama
from specdec.launch import Stack

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """target: 2-layer random Llama with the SmolLM2 tokenizer; draft: a noisy copy (partial acceptance)."""
    from specdec.models.embedded import embedded_target_path

    root = tmp_path_factory.mktemp("tiny")
    target = make_tiny_llama(root / "target", seed=0, tokenizer_dir=embedded_target_path())
    draft = make_noisy_copy(target, root / "draft", noise=0.02, seed=1)
    return {"target": target, "draft": draft}


@pytest.fixture(scope="module")
def draft_stack(tiny_models) -> Stack:
    with running_stack(stack_config(tiny_models, "draft")) as stack:
        yield stack


@pytest.fixture(scope="module")
def drafting_stack(tiny_models) -> Stack:
    """A draft-model stack that drafts 2 tokens at every step (no adaptive or load-aware choice): every
    step verifies a draft sent over the wire, whatever the timing (sampling and tau tests need that)."""
    with running_stack(always_drafting(stack_config(tiny_models, "draft"))) as stack:
        yield stack


@pytest.fixture(scope="module")
def ngram_stack(tiny_models) -> Stack:
    with running_stack(stack_config(tiny_models, "ngram")) as stack:
        yield stack


@pytest.fixture(scope="module")
def suffix_stack(tiny_models) -> Stack:
    with running_stack(stack_config(tiny_models, "suffix")) as stack:
        yield stack


@pytest.fixture(scope="session")
def http_stack(tiny_models) -> Stack:
    """A draft-model stack shared by the HTTP API's test modules (one start instead of one per module);
    drafting at every step, so a long generation holds its slot as long as the queue tests need."""
    with running_stack(always_drafting(stack_config(tiny_models, "draft"))) as stack:
        yield stack


@pytest.fixture(scope="session")
def reference(tiny_models):
    """In-process engines on the same checkpoints: reference(drafter, prompt, params) -> GenerationOutput."""
    engines = {}

    def generate(drafter, prompt, params, chat=False):
        import torch

        from specdec.engine import Engine

        torch.set_num_threads(1)
        if drafter not in engines:
            draft = str(tiny_models["draft"]) if drafter == "draft" else None
            engines[drafter] = Engine.from_pretrained(str(tiny_models["target"]), drafter=drafter, draft=draft,
                                                      dtype="float32")
        return engines[drafter].generate(prompt, params, chat=chat)

    return generate
