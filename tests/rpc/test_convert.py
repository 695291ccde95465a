"""pb <-> dataclass conversion, draft trees on the wire, status mapping, configs and flags."""
from __future__ import annotations

import argparse

import grpc
import pytest
import torch

from specdec import errors
from specdec.core.tree import DraftTree
from specdec.core.types import GenerationStats, SamplingParams
from specdec.drafters.draft_model import pick_children, truncate_top_n
from specdec.rpc.convert import (params_from_pb, params_to_pb, prompt_from_pb, prompt_to_pb, stats_from_pb,
                                 stats_to_pb)
from specdec.rpc.status import status_of, to_exception
from specdec.rpc.trees import tree_from_pb, tree_to_pb
from specdec.rpc.v1 import common_pb2, generation_pb2
from specdec.security_config import SecurityConfig
from specdec.config_fields import add_config_args, config_from_args, config_to_argv
from specdec.serving_config import DraftConfig, RouterConfig, TargetConfig, load_stack_config, with_workers


@pytest.mark.parametrize("params", [
    SamplingParams(),
    SamplingParams(temperature=0.7, top_p=0.9, top_k=40, seed=3, max_new_tokens=7, stop=("\n", "END"),
                   ignore_eos=True),
])
def test_params_round_trip(params):
    assert params_from_pb(params_to_pb(params)) == params


def test_unset_params_take_defaults_and_bad_ones_raise():
    assert params_from_pb(common_pb2.SamplingParams()) == SamplingParams()
    with pytest.raises(errors.InvalidArgument, match="top_p"):
        params_from_pb(common_pb2.SamplingParams(top_p=0.0))


def test_stats_round_trip():
    stats = GenerationStats(10, 4, 12, 6, 1.5, 0.1, 0.9, 0.2, 3, (3, 2, 1))
    assert stats_from_pb(stats_to_pb(stats)) == stats


@pytest.mark.parametrize("prompt", ["hello", [1, 2, 3], [{"role": "user", "content": "hi"}]])
def test_prompt_round_trip(prompt):
    request = generation_pb2.GenerateRequest()
    prompt_to_pb(request, prompt)
    assert prompt_from_pb(request) == prompt


def test_missing_prompt_is_invalid():
    with pytest.raises(errors.InvalidArgument, match="no prompt"):
        prompt_from_pb(generation_pb2.GenerateRequest())


def test_tree_round_trip_with_truncated_q():
    generator = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=1.0)
    logits = torch.randn(100, generator=generator)
    children = pick_children(logits, 2, params, generator, top_n=8)
    for token, q, _ in children:
        assert int((q > 0).sum()) <= 8 and q[token] > 0 and abs(float(q.sum()) - 1) < 1e-6
    q = torch.stack([c[1] for c in children])
    tree = DraftTree(tuple(c[0] for c in children), (-1, -1), q)
    msg = tree_to_pb(tree)
    assert all(len(row.token_ids) <= 8 for row in msg.q)  # only what was sampled from goes on the wire
    back = tree_from_pb(msg, 100, 8)
    assert back.token_ids == tree.token_ids and back.parent_ids == tree.parent_ids
    exact = (q.double() / q.double().sum(-1, keepdim=True)).float()  # what multinomial drew from
    assert torch.equal(back.q, exact)  # float32 both ways; renormalised in float64 on arrival


def test_q_off_by_rounding_is_renormalised_exactly():
    """A q within the 1e-3 tolerance but not summing to 1 is the distribution probs / sum: verification
    divides by it, so it must be used renormalised, not as sent."""
    probs = torch.tensor([0.5, 0.2995, 0.2])  # sums to 0.9995: accepted, off by 5e-4
    msg = tree_to_pb(DraftTree((3, 7), (-1, 0), torch.zeros(2, 10).index_put_(
        (torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([3, 5, 7, 7, 1, 2])), torch.cat([probs, probs]))))
    back = tree_from_pb(msg, 10, 8)
    assert torch.allclose(back.q.double().sum(-1), torch.ones(2, dtype=torch.float64), atol=1e-7)
    assert torch.allclose(back.q[0, [3, 5, 7]].double(), probs.double() / probs.double().sum(), atol=1e-7)
    assert float(back.q[1, 7]) == pytest.approx(0.5 / 0.9995, abs=1e-7)
    bad = tree_to_pb(DraftTree((3,), (-1,), torch.zeros(1, 10).index_put_((torch.tensor([0, 0]), torch.tensor([3, 4])),
                                                                           torch.tensor([0.5, 0.49]))))
    with pytest.raises(errors.InvalidArgument, match="q sums to 0.990000, not 1"):
        tree_from_pb(bad, 10, 8)


def test_truncate_top_n_keeps_default_untouched():
    q = torch.softmax(torch.randn(50), -1)
    assert truncate_top_n(q, 0) is q
    t = truncate_top_n(q, 5)
    assert int((t > 0).sum()) == 5 and abs(float(t.sum()) - 1) < 1e-6


def test_deterministic_tree_has_no_q():
    msg = tree_to_pb(DraftTree.chain([4, 5, 6]))
    assert len(msg.q) == 0 and tree_from_pb(msg, 10, 8).q is None


def test_status_mapping_both_ways():
    assert status_of(errors.InvalidArgument("bad"))[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert status_of(errors.ResourceExhausted("full"))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status_of(errors.DeadlineExceeded("late"))[0] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert status_of(RuntimeError("boom"))[0] == grpc.StatusCode.INTERNAL

    class Failed(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.RESOURCE_EXHAUSTED

        def details(self):
            return "busy"

    assert status_of(Failed()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "busy")
    exc = to_exception(Failed())
    assert isinstance(exc, errors.ResourceExhausted) and str(exc) == "busy"


@pytest.mark.parametrize("config", [TargetConfig(model="/m", draft_wait_s=0.5),
                                    TargetConfig(cuda_graphs=True), TargetConfig(cuda_graphs=False),
                                    DraftConfig(drafter="draft", pipeline=False, tree_width=2),
                                    RouterConfig(targets=("127.0.0.1:1", "127.0.0.1:2"), max_queue=0)])
def test_config_flags_round_trip(config):
    parser = argparse.ArgumentParser()
    add_config_args(parser, type(config))
    assert config_from_args(parser.parse_args(config_to_argv(config)), type(config)) == config


def test_cuda_graphs_is_unset_on_or_off():
    """Unset (None) leaves the choice to the worker (graphs wherever they run); a flag or key says on or off."""
    parser = argparse.ArgumentParser()
    add_config_args(parser, TargetConfig)
    assert "cuda-graphs" not in " ".join(config_to_argv(TargetConfig()))
    assert [config_from_args(parser.parse_args(argv), TargetConfig).cuda_graphs
            for argv in ([], ["--cuda-graphs"], ["--no-cuda-graphs"])] == [None, True, False]


def test_yaml_deployment(tmp_path):
    path = tmp_path / "stack.yaml"
    path.write_text("router: {port: 0, max_queue: 4}\ntargets:\n  - {model: /t, dtype: float32}\n"
                    "drafts:\n  - {drafter: draft, model: /d, pipeline: false}\n")
    config = load_stack_config(path)
    assert config.router.max_queue == 4 and config.targets[0].model == "/t"
    assert config.drafts[0].drafter == "draft" and config.drafts[0].pipeline is False
    path.write_text("router: {colour: blue}\n")
    with pytest.raises(errors.InvalidArgument, match="colour"):
        load_stack_config(path)


def test_every_router_field_of_a_yaml_file_reaches_the_spawned_router(tmp_path):
    """The launcher adds the started workers' addresses and changes nothing else (it once rebuilt the
    config field by field and dropped the per-user caps)."""
    import dataclasses

    path = tmp_path / "stack.yaml"
    path.write_text("router: {port: 5555, targets: [127.0.0.1:8], drafts: [127.0.0.1:9], tokenizer: /tok, "
                    "max_active: 3, max_queue: 5, worker_timeout_s: 7.5, max_active_per_user: 2, "
                    "max_queued_per_user: 1, http_port: 8001, api_keys_file: /keys, max_prompt_bytes: 1000, "
                    "max_stop_strings: 3, max_stop_bytes: 10, max_messages: 7, tokenize_threads: 3, "
                    "metrics_port: 9100, workers_file: /workers.yaml, discovery_interval_s: 0.5, "
                    "admin_keys_file: /admin, host: 0.0.0.0, advertise_host: router.internal, "
                    "drain_timeout_s: 5, security: {tls_cert_file: /c, tls_key_file: /k}}\n")
    loaded = load_stack_config(path).router
    assert all(getattr(loaded, f.name) != f.default for f in dataclasses.fields(RouterConfig))  # every field set
    spawned = with_workers(loaded, ("127.0.0.1:1",), ("127.0.0.1:2",))
    parser = argparse.ArgumentParser()
    add_config_args(parser, RouterConfig)
    parsed = config_from_args(parser.parse_args(config_to_argv(spawned)), RouterConfig)
    assert parsed == dataclasses.replace(loaded, targets=("127.0.0.1:1", "127.0.0.1:8"),
                                         drafts=("127.0.0.1:2", "127.0.0.1:9"))


def test_the_security_section_reaches_every_component_and_its_flags(tmp_path):
    """The file's section is every component's; a component's own keys replace it key by key; flags carry it."""
    path = tmp_path / "stack.yaml"
    path.write_text("security: {tls_cert_file: /c, tls_key_file: /k, tls_ca_file: /ca, token_file: /t}\n"
                    "router: {host: 0.0.0.0}\n"
                    "targets: [{model: /t, security: {tls_cert_file: /t.crt, tls_key_file: /t.key}}]\n")
    config = load_stack_config(path)
    shared = SecurityConfig(tls_cert_file="/c", tls_key_file="/k", tls_ca_file="/ca", token_file="/t")
    assert config.security == shared and config.router.security == shared and config.drafts[0].security == shared
    assert config.targets[0].security == SecurityConfig(tls_cert_file="/t.crt", tls_key_file="/t.key",
                                                        tls_ca_file="/ca", token_file="/t")
    assert config.router.host == "0.0.0.0" and config.targets[0].host == "127.0.0.1"
    for component in (config.router, config.targets[0], config.drafts[0]):
        parser = argparse.ArgumentParser()
        add_config_args(parser, type(component))
        assert config_from_args(parser.parse_args(config_to_argv(component)), type(component)) == component
    parser = argparse.ArgumentParser()
    add_config_args(parser, TargetConfig)
    assert config_from_args(parser.parse_args(["--insecure", "--host", "::"]), TargetConfig) == TargetConfig(
        host="::", security=SecurityConfig(insecure=True))
    path.write_text("security: {tls_cert_file: /c}\n")
    with pytest.raises(errors.InvalidArgument, match="tls_cert_file and tls_key_file go together"):
        load_stack_config(path)
    path.write_text("security: {colour: blue}\n")
    with pytest.raises(errors.InvalidArgument, match="colour"):
        load_stack_config(path)


def test_a_deployment_that_is_not_a_mapping_is_refused(tmp_path):
    path = tmp_path / "stack.yaml"
    path.write_text("- router\n")
    with pytest.raises(errors.InvalidArgument, match="must be a mapping"):
        load_stack_config(path)


def test_example_deployment_loads():
    from pathlib import Path

    config = load_stack_config(Path(__file__).resolve().parents[2] / "deploy" / "configs" / "local.yaml")
    assert config.drafts[0].drafter == "ngram" and config.targets[0].model is None
    secure = load_stack_config(Path(__file__).resolve().parents[2] / "deploy" / "configs" / "secure.yaml")
    assert secure.targets[0].security == secure.router.security == secure.security
    assert secure.security.mutual_tls and secure.router.host == "0.0.0.0"


def test_router_and_client_import_no_torch():
    import subprocess
    import sys

    code = ("import sys, router.server, router.http_api, specdec.client, specdec.commands.serve, "
            "specdec.commands.generate, specdec.loadtest_http; "
            "print('torch' in sys.modules or 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
