"""The stack as Ray actors: `up` places the workers and then the router, `down` drains and removes
them, `status` says what runs where. Run from anywhere that can join the cluster (`make deploy` on
the machine, the head pod of a KubeRay cluster); the actors are detached, so they outlive the call.

Names (in the deployment's Ray namespace): `<name>-target-<i>` (rank 0 of target i, in placement
group `<name>-target-<i>`), `<name>-draft-<j>`, `<name>-router`.
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

from specdec.deploy.actors import RouterActor, ServerActor
from specdec.deploy.config import DRAFT_RESOURCE, ROUTER_RESOURCE, TARGET_RESOURCE, DeployConfig, ProcessResources
from specdec.errors import InvalidArgument, Unavailable
from specdec.serving_config import StackConfig

PLACEMENT_TIMEOUT_S = 60.0
MAX_CONCURRENCY = 8  # an actor answers address / describe calls while `ready` waits


@dataclass(frozen=True)
class Deployed:
    router_address: str
    http_address: str  # "" = no HTTP API
    processes: tuple[dict, ...]  # ServerActor.describe() of each, with its "name"


def deploy_config(stack: StackConfig) -> DeployConfig:
    return stack.deploy if stack.deploy is not None else DeployConfig()


def names(config: DeployConfig, stack: StackConfig) -> dict[str, list[str]]:
    return {"targets": [f"{config.name}-target-{i}" for i in range(len(stack.targets))],
            "drafts": [f"{config.name}-draft-{j}" for j in range(len(stack.drafts))],
            "router": [f"{config.name}-router"]}


def needed_resources(stack: StackConfig) -> dict[str, float]:
    """Custom resource units the stack takes: one per process (per rank for targets)."""
    return {ROUTER_RESOURCE: 1, DRAFT_RESOURCE: len(stack.drafts), TARGET_RESOURCE: sum(t.tp for t in stack.targets)}


def keep_loopback(address: str | None) -> None:
    """Ray rewrites a loopback cluster address to this machine's outward IP before it connects, where a
    cluster bound to 127.0.0.1 does not listen; its switch for single-machine clusters keeps loopback
    as it is. Must be set before Ray is imported."""
    if address and address.rsplit(":", 1)[0] in ("127.0.0.1", "localhost"):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@contextlib.contextmanager
def connected(address: str | None, namespace: str):
    """Joined to the cluster at `address` for the block (a connection already open is used as it is)."""
    keep_loopback(address)
    import ray

    if ray.is_initialized():
        yield ray
        return
    try:
        ray.init(address=address or "auto", namespace=namespace, log_to_driver=False, logging_level="WARNING")
    except (ConnectionError, RuntimeError) as exc:
        raise Unavailable(f"cannot join the Ray cluster at {address or 'RAY_ADDRESS / auto'}: {exc}") from exc
    try:
        yield ray
    finally:
        ray.shutdown()


def named_actors(ray, config: DeployConfig) -> list[str]:
    """The deployment's actors alive or restarting now (by name, in its namespace)."""
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["namespace"] == config.namespace and a["name"].startswith(f"{config.name}-"))


def actor_options(config: DeployConfig, name: str | None, resources: ProcessResources, unit: str) -> dict:
    options = {"num_cpus": resources.num_cpus, "num_gpus": resources.num_gpus, "resources": {unit: 1},
               "max_concurrency": MAX_CONCURRENCY}
    if name is not None:  # a deployment's named actors outlive the caller and come back when they die
        options.update(name=name, namespace=config.namespace, lifetime="detached", max_restarts=config.max_restarts)
    return options


def check_capacity(ray, stack: StackConfig, wait_s: float = 0.0) -> None:
    """Refuse at once a cluster that lacks the custom resources, or wait up to `wait_s` for nodes to
    join (a KubeRay head starts before its worker pods)."""
    deadline = time.monotonic() + wait_s
    while True:
        offered = ray.cluster_resources()
        short = {k: (n, offered.get(k, 0)) for k, n in needed_resources(stack).items() if offered.get(k, 0) < n}
        if not short or time.monotonic() >= deadline:
            break
        time.sleep(5.0)
    if short:
        detail = ", ".join(f"{k}: needs {n:g}, the cluster offers {have:g}" for k, (n, have) in short.items())
        raise Unavailable(f"the cluster cannot place the stack ({detail}); start nodes with "
                          f"ray start --resources '{{\"{next(iter(short))}\": N}}'")


def place_target(ray, config: DeployConfig, name: str, tp: int):
    """The target's ranks' bundles, all on one node (STRICT_PACK): they all-reduce every forward."""
    from ray.util.placement_group import placement_group

    bundle = {"CPU": config.targets.num_cpus, TARGET_RESOURCE: 1}
    if config.targets.num_gpus:
        bundle["GPU"] = config.targets.num_gpus
    group = placement_group([dict(bundle) for _ in range(tp)], strategy="STRICT_PACK", name=name,
                            lifetime="detached")
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        ray.util.remove_placement_group(group)
        raise Unavailable(f"placement group {name} ({tp} x {bundle}) found no node within {PLACEMENT_TIMEOUT_S:.0f} s: "
                          f"one node must offer {tp} {TARGET_RESOURCE}")
    return group


def up(stack: StackConfig, address: str | None = None, echo=print, capacity_wait_s: float = 0.0) -> Deployed:
    """Place the workers, wait until they serve, then the router; on any failure remove what was placed.
    capacity_wait_s: how long nodes with the needed resources may take to join."""
    config = deploy_config(stack)
    named = names(config, stack)
    env = dict(config.env)
    with connected(address, config.namespace) as ray:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if f"{config.name}-router" in named_actors(ray, config):
            raise InvalidArgument(f"{config.name} is already deployed in namespace {config.namespace}: "
                                  f"`specdec deploy down` first (or `specdec deploy status`)")
        check_capacity(ray, stack, capacity_wait_s)
        try:
            workers = []
            for name, target in zip(named["targets"], stack.targets):
                group = place_target(ray, config, name, target.tp)
                options = actor_options(config, name, config.targets, TARGET_RESOURCE)
                followers = actor_options(config, None, config.targets, TARGET_RESOURCE) | {"max_restarts": 0}
                strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
                workers.append((name, ray.remote(ServerActor).options(**options, scheduling_strategy=strategy).remote(
                    "target", target, env, stack.ready_timeout_s, 0, followers)))
            for name, draft in zip(named["drafts"], stack.drafts):
                options = actor_options(config, name, config.drafts, DRAFT_RESOURCE)
                workers.append((name, ray.remote(ServerActor).options(**options).remote(
                    "draft", draft, env, stack.ready_timeout_s)))
            echo(f"placed {len(workers)} workers; waiting until they serve (model loading)")
            wait_ready(ray, workers, stack.ready_timeout_s)
            router = ray.remote(RouterActor).options(**actor_options(config, named["router"][0], config.router,
                                                                     ROUTER_RESOURCE)).remote(
                stack.router, env, stack.ready_timeout_s, config.namespace, named["targets"], named["drafts"],
                stack.router.discovery_interval_s)
            [ready] = wait_ready(ray, [(named["router"][0], router)], stack.ready_timeout_s)
        except BaseException:
            remove(ray, config, [n for group in named.values() for n in group], grace_s=5.0)
            remove_groups(ray, config)
            raise
        return Deployed(ready["address"], ready["http_address"], describe(ray, config, named))


def wait_ready(ray, actors: list[tuple[str, object]], timeout_s: float) -> list[dict]:
    refs = [actor.ready.remote() for _, actor in actors]
    done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s + 30.0)
    answers = []
    for (name, _), ref in zip(actors, refs):
        answer = ray.get(ref) if ref in done else {"error": f"no answer within {timeout_s:.0f} s"}
        if answer["error"]:
            raise Unavailable(f"{name}: {answer['error']}")
        answers.append(answer)
    return answers


def describe(ray, config: DeployConfig, named: dict[str, list[str]] | None = None) -> tuple[dict, ...]:
    """Every process of the deployment as its actor reports it (or as unreachable)."""
    found = named_actors(ray, config) if named is None else [n for group in named.values() for n in group]
    refs = {}
    for name in found:
        try:
            refs[name] = ray.get_actor(name, namespace=config.namespace).describe.remote()
        except ValueError:
            continue
    done, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=10.0)
    out = []
    for name, ref in refs.items():
        try:
            info = ray.get(ref) if ref in done else {"state": "not answering (restarting?)"}
        except Exception as exc:  # noqa: BLE001 - a dead actor: say so
            info = {"state": f"dead: {type(exc).__name__}"}
        out.append({"name": name, **info})
    return tuple(out)


def remove(ray, config: DeployConfig, actor_names: list[str], grace_s: float | None = None) -> list[str]:
    """Drain (SIGTERM, each server's own drain time), then kill without restart. Placement groups go
    after their actors (remove_groups): removing a group first kills its actor, which Ray would then
    try to restart into a group that no longer exists."""
    actors = []
    for name in actor_names:
        try:
            actors.append((name, ray.get_actor(name, namespace=config.namespace)))
        except ValueError:
            continue
    refs = [actor.stop.remote(grace_s) for _, actor in actors]
    ray.wait(refs, num_returns=len(refs), timeout=(grace_s or 60.0) + 15.0)
    for _, actor in actors:
        ray.kill(actor, no_restart=True)
    return [name for name, _ in actors]


def remove_groups(ray, config: DeployConfig) -> None:
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    for group in ray.util.placement_group_table().values():
        if group.get("name", "").startswith(f"{config.name}-target-") and group.get("state") != "REMOVED":
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group["placement_group_id"]))))


def down(config: DeployConfig, address: str | None = None) -> list[str]:
    """Stop the router first (no new work), then the workers; returns the names stopped."""
    with connected(address, config.namespace) as ray:
        present = named_actors(ray, config)
        router = [n for n in present if n == f"{config.name}-router"]
        stopped = remove(ray, config, router)
        stopped += remove(ray, config, [n for n in present if n not in router])
        remove_groups(ray, config)
        return stopped


def status(config: DeployConfig, address: str | None = None) -> dict:
    """{"nodes": [...], "processes": [...]}: the cluster's nodes with their specdec resources, and what runs where."""
    with connected(address, config.namespace) as ray:
        nodes = [{"node_id": n["NodeID"], "node_ip": n["NodeManagerAddress"],
                  "resources": {k: v for k, v in n["Resources"].items() if k.startswith("specdec_") or k in ("CPU", "GPU")}}
                 for n in ray.nodes() if n.get("Alive")]
        return {"nodes": nodes, "processes": list(describe(ray, config))}
