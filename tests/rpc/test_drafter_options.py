"""A deployment's drafter options: from YAML, flags and the spawned worker's argv to the drafter, refused by
name before any weight loads."""
from __future__ import annotations

import subprocess
import sys

import pytest

from specdec.cli import build_parser
from specdec.config_fields import config_from_args, config_to_argv
from specdec.errors import InvalidArgument
from specdec.serving_config import DraftConfig, TargetConfig, load_stack_config


def test_yaml_mapping_reaches_both_workers_as_canonical_json(tmp_path):
    path = tmp_path / "stack.yaml"
    path.write_text("targets:\n  - drafter: hybrid\n    drafter_options: {num_nodes: 24, mode: choose}\n"
                    "drafts:\n  - drafter: suffix\n    drafter_options: {global_tokens: 0}\n")
    stack = load_stack_config(path)
    assert stack.targets[0].drafter_options == '{"mode": "choose", "num_nodes": 24}'
    assert stack.drafts[0].drafter_options == '{"global_tokens": 0}'
    assert TargetConfig(drafter="hybrid", drafter_options='{"num_nodes": 24, "mode": "choose"}') == stack.targets[0]
    hash(stack.targets[0])  # a frozen config stays hashable


@pytest.mark.parametrize("cls, piece, drafter", [(TargetConfig, "target", "hybrid"), (DraftConfig, "draft", "ngram")])
def test_a_spawned_worker_gets_the_same_options(cls, piece, drafter):
    """The launcher spawns a worker with config_to_argv: its flags must rebuild the same config."""
    config = cls(drafter=drafter, drafter_options={"num_nodes": 12})
    args = build_parser().parse_args(["serve", piece, *config_to_argv(config)])
    assert config_from_args(args, cls) == config


def test_serve_flag_reaches_where_the_drafter_runs():
    from specdec.commands.serve import stack_config

    def parsed(*argv):
        return stack_config(build_parser().parse_args(["serve", *argv]))

    stack = parsed("--drafter", "suffix", "--drafter-options", '{"num_nodes": 4}')
    assert stack.drafts[0].drafter_options == '{"num_nodes": 4}' and stack.targets[0].drafter_options == ""
    stack = parsed("--drafter", "hybrid", "--drafter-options", '{"mode": "choose"}')
    assert stack.targets[0].drafter_options == '{"mode": "choose"}' and not stack.drafts


@pytest.mark.parametrize("drafter, options, message", [
    ("suffix", {"tree_width": 2}, "takes no option tree_width"),
    ("none", {"num_nodes": 2}, "takes no option num_nodes"),
    ("ngram", "[1, 2]", "must be a mapping"),
    ("ngram", '{"num_nodes": ', "must be a JSON object"),
])
def test_bad_options_are_refused_when_the_config_is_read(drafter, options, message):
    with pytest.raises(InvalidArgument, match=message):
        TargetConfig(drafter=drafter, drafter_options=options)


def test_cli_refuses_unknown_options_with_one_line_and_exit_2():
    done = subprocess.run([sys.executable, "-m", "specdec.cli", "serve", "--drafter", "suffix",
                           "--drafter-options", '{"bogus": 1}'], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "specdec: error: drafter 'suffix' takes no option bogus "
        "(valid: carry_miss, global_tokens, max_depth, min_token_prob, num_nodes, spec_factor)")


def test_generate_merges_the_options_over_tree_width():
    from specdec.commands.generate import drafter_options

    args = build_parser().parse_args(["generate", "--drafter", "ngram", "--tree-width", "3",
                                      "--drafter-options", '{"num_nodes": 6}', "hi"])
    assert drafter_options(args) == {"num_branches": 3, "num_nodes": 6}
    args = build_parser().parse_args(["generate", "--drafter", "suffix", "--drafter-options", '{"nodes": 6}', "hi"])
    with pytest.raises(InvalidArgument, match="takes no option nodes"):
        drafter_options(args)
