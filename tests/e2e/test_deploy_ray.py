"""`make deploy`'s code path (specdec.deploy.ray_stack.up) on a Ray cluster of three nodes on this
machine, each offering its own custom resource: the router lands on the head, the draft worker on the
draft node, the target's two tensor-parallel ranks together on the target node (one STRICT_PACK
placement group); greedy output equals the in-process engine's; a draft
worker killed mid-generation costs the request nothing, Ray restarts it on a new port and the router
finds it there and uses it again; `down` leaves no process behind.

One cluster and one deployment per module (starting them is most of the time)."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from specdec.client import Client
from specdec.core.types import SamplingParams
from specdec.deploy.config import DeployConfig
from specdec.deploy.ray_stack import keep_loopback
from specdec.serving_config import DraftConfig, RouterConfig, StackConfig, TargetConfig

pytestmark = pytest.mark.e2e
NAMESPACE = "specdec-test"
NODE = {"num_cpus": 1, "object_store_memory": 100 << 20, "node_ip_address": "127.0.0.1"}
PROMPT = [11, 22, 33, 44, 11, 22]
PARAMS = SamplingParams(max_new_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def cluster():
    """Head (specdec_router), a draft node (specdec_draft) and a target node (specdec_target)."""
    keep_loopback("127.0.0.1:0")
    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")  # not Ray's 30 s: a busy machine has missed it
    since = uptime_s()
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False,
                                                            "resources": {"specdec_router": 1}})
    try:
        nodes = {"router": cluster.head_node.node_id,
                 "draft": cluster.add_node(**NODE, resources={"specdec_draft": 1}).node_id,
                 "target": cluster.add_node(**{**NODE, "num_cpus": 2}, resources={"specdec_target": 2}).node_id}
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False, logging_level="WARNING")
        yield cluster, nodes, since
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def deployed(cluster, tiny_models):
    from specdec.deploy import ray_stack

    target = str(tiny_models["target"])
    stack = StackConfig(
        router=RouterConfig(max_active=4, max_queue=4, http_port=-1, discovery_interval_s=0.5),
        targets=(TargetConfig(model=target, dtype="float32", num_threads=1, tp=2),),
        drafts=(DraftConfig(drafter="draft", model=str(tiny_models["draft"]), target_model=target, dtype="float32",
                            num_threads=1),),
        ready_timeout_s=120.0,
        deploy=DeployConfig(name="t", namespace=NAMESPACE, max_restarts=2, env={"OMP_NUM_THREADS": "1"}))
    result = ray_stack.up(stack, cluster[0].address, echo=lambda line: None)
    try:
        yield result, stack
    finally:
        ray_stack.down(stack.deploy, cluster[0].address)


def by_name(processes) -> dict[str, dict]:
    return {p["name"]: p for p in processes}


def test_each_process_runs_on_the_node_with_its_resource_and_output_is_the_engines(cluster, deployed, reference):
    import ray

    _, nodes, _ = cluster
    result, _ = deployed
    placed = by_name(result.processes)
    assert {n: p["node_id"] for n, p in placed.items()} == {
        "t-target-0": nodes["target"], "t-draft-0": nodes["draft"], "t-router": nodes["router"]}
    assert all(p["state"] == "serving" and p["address"].startswith("127.0.0.1:") for p in placed.values())
    [group] = [g for g in ray.util.placement_group_table().values() if g["name"] == "t-target-0"]
    assert group["strategy"] == "STRICT_PACK" and len(group["bundles"]) == 2 and placed["t-target-0"]["followers"] == 1
    assert set(group["bundles_to_node_id"].values()) == {nodes["target"]}  # both ranks on the target node
    with Client(result.router_address) as client:
        out = client.generate(PROMPT, PARAMS, timeout_s=60)
    assert out.token_ids == reference("draft", PROMPT, PARAMS).token_ids
    assert out.stats.num_draft_tokens > 0  # the draft worker took part


def test_a_killed_draft_worker_costs_nothing_and_ray_brings_it_back_to_the_router(cluster, deployed, reference):
    import ray

    from specdec.deploy import ray_stack

    result, stack = deployed
    before = by_name(ray_stack.status(stack.deploy)["processes"])["t-draft-0"]
    long_params = SamplingParams(max_new_tokens=120, ignore_eos=True)
    tokens, killed = [], []
    with Client(result.router_address) as client:
        for chunk in client.stream(PROMPT, long_params, timeout_s=120):
            tokens += chunk.token_ids
            if not killed and len(tokens) >= 10:
                os.kill(before["server_pid"], signal.SIGKILL)  # the draft node's server, mid-generation
                killed.append(len(tokens))
        assert killed and tokens == reference("draft", PROMPT, long_params).token_ids

        deadline = time.monotonic() + 90
        while True:  # Ray restarts the actor; its new server starts, on a port of its own
            after = by_name(ray_stack.status(stack.deploy)["processes"]).get("t-draft-0", {})
            if after.get("state") == "serving" and after.get("restarted"):
                break
            assert time.monotonic() < deadline, f"draft worker not back: {after}"
            time.sleep(0.5)
        assert after["node_id"] == before["node_id"] and after["server_pid"] != before["server_pid"]
        while True:  # the router's discovery lists the new address and no longer the old one
            drafts = {d.address: d.healthy for d in client.server_info().drafts}
            if drafts == {after["address"]: True}:
                break
            assert time.monotonic() < deadline, f"router still sees {drafts}, not {after['address']}"
            time.sleep(0.2)
        out = client.generate(PROMPT, PARAMS, timeout_s=60)
        assert out.token_ids == reference("draft", PROMPT, PARAMS).token_ids
        assert out.stats.num_draft_tokens > 0  # drafted by the restarted worker, the only one
        [draft] = client.server_info().drafts
        assert draft.address == after["address"] and draft.info.num_served >= 1
    assert ray.get_actor("t-draft-0", namespace=NAMESPACE) is not None


def test_a_second_up_is_refused_and_down_stops_every_process(cluster, deployed, tiny_models):
    """Last in the module: `down` on the module's deployment (its fixture's own `down` then finds nothing)."""
    import ray

    from specdec.deploy import ray_stack
    from specdec.errors import InvalidArgument

    _, stack = deployed
    with pytest.raises(InvalidArgument, match="already deployed"):
        ray_stack.up(stack, cluster[0].address)
    processes = ray_stack.status(stack.deploy)["processes"]
    pids = [p[key] for p in processes for key in ("actor_pid", "server_pid")]
    _, _, since = cluster
    ranks = [pid for pid in target_servers(str(tiny_models["target"])) if started_after(pid, since)]
    assert len(pids) == 6 and len(ranks) == 2 and all(alive(pid) for pid in pids + ranks)
    pids += ranks
    assert sorted(ray_stack.down(stack.deploy, cluster[0].address)) == ["t-draft-0", "t-router", "t-target-0"]
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in pids):
        assert time.monotonic() < deadline, [pid for pid in pids if alive(pid)]
        time.sleep(0.2)
    assert ray_stack.status(stack.deploy)["processes"] == []
    assert not [g for g in ray.util.placement_group_table().values()
                if g["name"].startswith("t-") and g["state"] != "REMOVED"]


def target_servers(model: str) -> list[int]:
    """Process ids of `specdec serve target` processes serving `model` (both tensor-parallel ranks)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and b"target" in argv and model.encode() in argv and alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def uptime_s() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def started_after(pid: int, since_uptime_s: float) -> bool:
    """Whether `pid` started after `since_uptime_s` (seconds since boot): the module's own ranks, not another
    module's target server on the same tiny checkpoint (the session-wide HTTP stack, for one)."""
    try:
        ticks = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return False
    return ticks / os.sysconf("SC_CLK_TCK") >= since_uptime_s


def alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie (exited, not yet reaped) does not, nor one that is gone by the time its
    /proc entry is read (it can exit between the two looks)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
