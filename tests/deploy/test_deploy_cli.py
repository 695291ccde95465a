"""`specdec deploy` without a cluster: the local head's command (127.0.0.1, the stack's resources, no
dashboard, a small object store), its state file (a stale or reused pid is not taken for the head,
stopping signals only the recorded process), the deploy section's parsing, and one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdec.cli import main
from specdec.deploy import local_cluster
from specdec.deploy.config import DeployConfig, ProcessResources
from specdec.deploy.ray_stack import needed_resources
from specdec.serving_config import DraftConfig, StackConfig, TargetConfig, load_stack_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_local_head_offers_what_the_stack_needs_on_loopback_only():
    stack = StackConfig(targets=(TargetConfig(tp=2), TargetConfig()), drafts=(DraftConfig(),) * 3,
                        deploy=DeployConfig(targets=ProcessResources(num_cpus=4), object_store_mb=150))
    assert needed_resources(stack) == {"specdec_router": 1, "specdec_draft": 3, "specdec_target": 3}
    argv = local_cluster.head_command(stack, 6390)
    options = dict(zip(argv[argv.index("start") + 1::], argv[argv.index("start") + 2::]))
    assert options["--node-ip-address"] == "127.0.0.1" and options["--port"] == "6390"
    assert json.loads(options["--resources"]) == needed_resources(stack)
    assert int(options["--num-cpus"]) >= 1 + 3 + 3 * 4  # Ray's CPUs are a count for placement here
    assert options["--include-dashboard"] == "false" and options["--object-store-memory"] == str(150 << 20)
    assert "--block" in argv  # it stays our child-like process: one signal stops the whole cluster


def _wait_exec(process: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Until the child has exec'd: between fork and exec its /proc cmdline is still the parent's (pytest's),
    which the state file rightly refuses as a reused pid."""
    deadline = time.monotonic() + timeout_s
    while b"time.sleep(60)" not in Path(f"/proc/{process.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, "the stand-in process never started"
        time.sleep(0.01)


def test_the_state_file_names_the_head_only_while_it_runs_and_stop_signals_only_it(tmp_path):
    path = local_cluster.state_file("demo", str(tmp_path))
    assert local_cluster.read_state(path) is None
    # a stand-in for `ray start --block`: a process whose command line says so and that stops on SIGTERM
    head = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "ray", "start"],
                            start_new_session=True)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "ray", "start"])
    try:
        _wait_exec(head)
        _wait_exec(bystander)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"pid": head.pid, "address": "127.0.0.1:1", "log": ""}))
        assert local_cluster.read_state(path)["address"] == "127.0.0.1:1"
        start = time.monotonic()
        assert local_cluster.stop_local(path, timeout_s=10)
        assert head.poll() is not None and time.monotonic() - start < 10 and not path.exists()
        assert bystander.poll() is None  # another Ray-looking process of the same user is left alone
        path.write_text(json.dumps({"pid": bystander.pid, "address": "x", "log": ""}))
        bystander.kill()
        bystander.wait()
        assert local_cluster.read_state(path) is None and not path.exists()  # its pid is gone: stale
    finally:
        for process in (head, bystander):
            process.kill()
            process.wait()


def test_the_deploy_section_is_read_with_the_serving_config_keeping_unnamed_defaults():
    stack = load_stack_config(ROOT / "deploy/configs/k8s-gpu.yaml")
    assert stack.deploy.name == "specdec-gpu" and stack.deploy.targets.num_gpus == 1
    assert stack.deploy.k8s.targets.memory == "64Gi" and stack.deploy.k8s.head.memory == "8Gi"  # defaults kept
    assert load_stack_config(ROOT / "deploy/configs/local.yaml").deploy.max_restarts == -1


@pytest.mark.parametrize("text, message", [
    ("deploy: {k8s: {targetz: {}}}\n", "deploy.k8s: unknown keys targetz"),
    ("deploy: {name: Not_A_Label}\n", "DNS label"),
    ("deploy: {targets: {num_gpus: -1}}\n", "invalid resources"),
])
def test_a_bad_deploy_section_is_one_line_and_exit_code_2(tmp_path, capsys, text, message):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    assert main(["deploy", "up", "--k8s", "--config", str(config), "--out", str(tmp_path / "k8s")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec: error: ") and message in err and len(err.strip().splitlines()) == 1


def test_status_with_nothing_deployed_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["deploy", "status", "--state-dir", str(tmp_path)]) == 2
    assert "is not deployed" in capsys.readouterr().err
    assert main(["deploy", "down", "--state-dir", str(tmp_path)]) == 0
    assert "nothing to stop" in capsys.readouterr().out


def test_a_server_that_binds_beyond_loopback_advertises_its_nodes_address_unless_told_otherwise():
    import dataclasses

    from specdec.deploy.actors import placed_on_node

    @dataclasses.dataclass(frozen=True)
    class WithHost:  # the shape of a server config with the `host` / `advertise_host` keys
        host: str = "127.0.0.1"
        advertise_host: str | None = None

    assert placed_on_node(WithHost(), "10.0.0.5") == WithHost()  # loopback: nothing to advertise
    assert placed_on_node(WithHost(host="0.0.0.0"), "10.0.0.5").advertise_host == "10.0.0.5"
    assert placed_on_node(WithHost(host="0.0.0.0", advertise_host="svc.local"), "10.0.0.5").advertise_host == "svc.local"
    assert placed_on_node(TargetConfig(), "10.0.0.5") == TargetConfig()  # a config without those keys passes as is
