"""`specdec deploy up|down|status`: the stack of a YAML deployment file on a Ray cluster (`make deploy`,
`make undeploy`, `make status`), or with --k8s as Kubernetes manifests for KubeRay (`make deploy K8S=1`).

Which Ray cluster: --address, else the file's deploy.ray_address, else RAY_ADDRESS, else the local
cluster an earlier `up` started (its state file), else `up` starts one on 127.0.0.1 and `down` stops
it once the stack is gone.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import threading

from specdec.errors import Unavailable
from specdec.serving_config import StackConfig, load_stack_config


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("deploy", help="the stack on a Ray cluster (local by default) or as KubeRay manifests")
    p.set_defaults(run=lambda args: p.print_help() or 2)
    actions = p.add_subparsers(dest="action", metavar="{up,down,status}")
    for action, text in (("up", "start the stack and print the router's address"),
                         ("down", "drain and stop the stack (and the local cluster `up` started)"),
                         ("status", "what runs where")):
        sp = actions.add_parser(action, help=text)
        sp.add_argument("--config", default=None, help="YAML deployment file (the one `specdec serve --config` reads)")
        sp.add_argument("--address", default=None, help="Ray cluster address (default: deploy.ray_address, "
                                                        "RAY_ADDRESS, or a local cluster on 127.0.0.1)")
        sp.add_argument("--state-dir", default=None, help="where the local cluster's state file lives "
                                                          "(default ~/.cache/specdec/deploy)")
        sp.add_argument("--k8s", action="store_true", help="Kubernetes through KubeRay instead of a Ray cluster")
        sp.add_argument("--out", default="deploy/k8s", help="--k8s: the manifests' directory")
        sp.set_defaults(run=globals()[f"run_{action}"])
        if action == "up":
            sp.add_argument("--foreground", action="store_true",
                            help="stay running; on SIGTERM drain and stop the stack (a KubeRay head pod)")
            sp.add_argument("--ray-start-cmd", default=None,
                            help="with --foreground: start the Ray head with this shell command first "
                                 "(KubeRay's $KUBERAY_GEN_RAY_START_CMD)")
        if action == "status":
            sp.add_argument("--json", action="store_true", help="print JSON")


def _stack(args) -> StackConfig:
    return load_stack_config(args.config) if args.config else StackConfig()


def _address(args, stack: StackConfig) -> tuple[str | None, bool]:
    """(the cluster address or None: nothing running; whether it is the local cluster we started)."""
    from specdec.deploy.local_cluster import read_state, state_file
    from specdec.deploy.ray_stack import deploy_config

    config = deploy_config(stack)
    named = args.address or config.ray_address or os.environ.get("RAY_ADDRESS")
    if named:
        return named, False
    state = read_state(state_file(config.name, args.state_dir))
    return (state["address"], True) if state else (None, True)


def run_up(args: argparse.Namespace) -> int:
    stack = _stack(args)
    if args.k8s:
        from specdec.deploy.k8s_files import up_k8s

        return up_k8s(stack, args.config, args.out)
    from specdec.deploy import local_cluster, ray_stack

    config = ray_stack.deploy_config(stack)
    head = local_cluster.run_head(args.ray_start_cmd) if args.ray_start_cmd else None
    address, local = _address(args, stack)
    path = local_cluster.state_file(config.name, args.state_dir)
    started = head is None and address is None
    if started:
        address = local_cluster.start_local(stack, path)
    try:
        deployed = ray_stack.up(stack, address or "auto",
                                capacity_wait_s=config.k8s.startup_timeout_s if args.foreground else 0.0)
    except BaseException:
        if started:
            local_cluster.stop_local(path)
        raise
    http = f"; OpenAI-compatible HTTP API on http://{deployed.http_address}/v1" if deployed.http_address else ""
    for process in deployed.processes:
        print(f"  {process['name']:<24} {process['kind']:<7} node {process['node_ip']} "
              f"({process['node_id'][:8]})  {process['address']}")
    print(f"specdec deployed on Ray ({address or 'auto'}): router on {deployed.router_address}{http}", flush=True)
    if not args.foreground:
        print("`make status` shows what runs where; `make undeploy` stops it.", flush=True)
        return 0
    return _stay(args, stack, address or "auto", head)


def _stay(args, stack: StackConfig, address: str, head) -> int:
    """Until SIGTERM (the pod is deleted): then drain and stop the stack, then the head we started."""
    from specdec.deploy import ray_stack

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(5.0):
        if head is not None and head.poll() is not None:
            print("specdec: the Ray head ended", flush=True)
            return 1
    ray_stack.down(ray_stack.deploy_config(stack), address)
    if head is not None:
        head.terminate()
        head.wait(60)
    return 0


def run_down(args: argparse.Namespace) -> int:
    stack = _stack(args)
    if args.k8s:
        from specdec.deploy.k8s_files import down_k8s

        return down_k8s(stack, args.out)
    from specdec.deploy import local_cluster, ray_stack

    config = ray_stack.deploy_config(stack)
    address, local = _address(args, stack)
    if address is None:
        print(f"nothing to stop: no Ray cluster named and no local cluster recorded for {config.name}")
        return 0
    stopped = ray_stack.down(config, address)
    print(f"stopped {', '.join(stopped) or 'nothing (no process of ' + config.name + ' was running)'}")
    if local and local_cluster.stop_local(local_cluster.state_file(config.name, args.state_dir)):
        print(f"stopped the local Ray cluster on {address}")
    return 0


def run_status(args: argparse.Namespace) -> int:
    stack = _stack(args)
    if args.k8s:
        from specdec.deploy.k8s_files import status_k8s

        return status_k8s(stack)
    from specdec.deploy import ray_stack

    config = ray_stack.deploy_config(stack)
    address, local = _address(args, stack)
    if address is None:
        raise Unavailable(f"{config.name} is not deployed: no Ray cluster named (--address, RAY_ADDRESS) and no "
                          f"local cluster recorded; `make deploy` starts one")
    found = ray_stack.status(config, address)
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    print(f"Ray cluster {address}{' (local, started by specdec deploy)' if local else ''}")
    for node in found["nodes"]:
        resources = " ".join(f"{k}={v:g}" for k, v in sorted(node["resources"].items()))
        print(f"  node {node['node_ip']} ({node['node_id'][:8]}): {resources}")
    if not found["processes"]:
        print(f"{config.name}: not deployed")
    for p in found["processes"]:
        where = f"node {p['node_ip']} ({p['node_id'][:8]})" if "node_id" in p else ""
        print(f"  {p['name']:<24} {p.get('kind', ''):<7} {p.get('state', ''):<9} {p.get('address', ''):<22} {where}"
              f"{'  restarted' if p.get('restarted') else ''}{'  ' + p['error'] if p.get('error') else ''}")
    return 0
