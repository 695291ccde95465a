"""Kubernetes manifests for the stack through KubeRay, from the deployment file.

A RayCluster (not a RayService: the stack is Ray actors serving gRPC, not a Ray Serve application)
with a head group (the router) and two worker groups (draft and target nodes), each pod offering the
custom resources its kind needs, so `specdec deploy up` inside the head pod places every process
where it belongs, exactly as `make deploy` does on a local cluster. With the annotation
`ray.io/overwrite-container-cmd`, KubeRay leaves the container commands to us and hands over its
generated `ray start` in $KUBERAY_GEN_RAY_START_CMD: the head runs `specdec deploy up --foreground`,
which starts Ray from it, deploys, and on SIGTERM drains before the pod goes.

Around it: the Namespace, a ConfigMap with the in-cluster config (k8s_config), Secrets for the files
and variables holding secrets, a Service for the router, and a PodDisruptionBudget per group.
"""
from __future__ import annotations

import base64
import json
import math

from specdec.deploy.config import DRAFT_RESOURCE, ROUTER_RESOURCE, TARGET_RESOURCE, DeployConfig, PodGroup
from specdec.deploy.k8s_config import (CONFIG_DIR, CONFIG_FILE, SECRETS_DIR, config_text, read_secret_files,
                                       secret_env_names)
from specdec.serving_config import StackConfig

RAY_VERSION = "2.60.0"  # the pin in pyproject.toml: the image's Ray
GCS_PORT = 6379
DRAIN_MARGIN_S = 30  # terminationGracePeriodSeconds beyond the longest drain: stopping Ray, flushing logs
PROBE_PERIOD_S = 10


def _labels(config: DeployConfig, role: str) -> dict:
    return {"app.kubernetes.io/part-of": "specdec", "specdec.io/deployment": config.name, "specdec.io/role": role}


def _meta(config: DeployConfig, name: str, role: str, **extra) -> dict:
    return {"name": name, "namespace": config.k8s.namespace, "labels": _labels(config, role), **extra}


def drain_s(stack: StackConfig) -> int:
    """The longest drain of any server (drain_timeout_s where the config has it; 30 s otherwise)."""
    configs = [stack.router, *stack.targets, *stack.drafts]
    return int(max(float(getattr(c, "drain_timeout_s", None) or 30.0) for c in configs))


def _probes(port: int, startup_timeout_s: int, loads_model: bool, tls: bool = False) -> dict:
    """gRPC health checks (grpc.health.v1, served by every specdec server): ready = serving; the
    startup probe gives model loading its time before liveness counts. A worker whose server Ray is
    restarting loads its model again: liveness gives it as long before the pod is given up. With TLS
    the kubelet's plaintext gRPC probe cannot connect: an exec probe presents the config's credentials."""
    def check(**timing) -> dict:
        if tls:
            return {"exec": {"command": ["python", "-m", "specdec.rpc.health_probe", f"127.0.0.1:{port}",
                                         "--config", CONFIG_FILE]}, **timing}
        return {"grpc": {"port": port}, **timing}

    loading = math.ceil(startup_timeout_s / PROBE_PERIOD_S)
    return {"readinessProbe": check(periodSeconds=5, failureThreshold=2),
            "livenessProbe": check(periodSeconds=PROBE_PERIOD_S, failureThreshold=loading if loads_model else 6,
                                   timeoutSeconds=5),
            "startupProbe": check(periodSeconds=PROBE_PERIOD_S,
                                  failureThreshold=loading)}


def _resources(group: PodGroup, gpus: int, gpu_resource: str) -> dict:
    requests = {"cpu": group.cpu, "memory": group.memory}
    limits = dict(requests)
    if gpus:
        requests[gpu_resource] = limits[gpu_resource] = str(gpus)
    return {"requests": requests, "limits": limits}


def _pod(stack: StackConfig, role: str, group: PodGroup, args: str, ports: list[dict], probe_port: int,
         gpus: int, secrets: bool) -> dict:
    config = stack.deploy or DeployConfig()
    k8s = config.k8s
    mounts = [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]
    volumes = [{"name": "config", "configMap": {"name": f"{config.name}-config"}}]
    if secrets:
        mounts.append({"name": "secrets", "mountPath": SECRETS_DIR, "readOnly": True})
        volumes.append({"name": "secrets", "secret": {"secretName": f"{config.name}-files", "defaultMode": 0o400}})
    container = {"name": "ray-head" if role == "router" else "ray-worker", "image": k8s.image,
                 "imagePullPolicy": k8s.image_pull_policy, "command": ["/bin/bash", "-lc", "--"], "args": [args],
                 "ports": ports, "resources": _resources(group, gpus, k8s.gpu_resource),
                 "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
                 "envFrom": [{"secretRef": {"name": f"{config.name}-env", "optional": True}}],
                 "volumeMounts": mounts, **_probes(probe_port, k8s.startup_timeout_s, role != "router",
                                                   tls=stack.security.tls)}
    spec = {"containers": [container], "volumes": volumes,
            "terminationGracePeriodSeconds": drain_s(stack) + DRAIN_MARGIN_S}
    if group.node_selector:
        spec["nodeSelector"] = dict(group.node_selector)
    if group.tolerations:
        spec["tolerations"] = [dict(t) for t in group.tolerations]
    return {"metadata": {"labels": _labels(config, role)}, "spec": spec}


def _ray_resources(units: dict) -> str:
    """rayStartParams' `resources`: JSON inside double quotes, as KubeRay passes it to a shell."""
    return '"' + json.dumps(units).replace('"', '\\"') + '"'


def raycluster(stack: StackConfig, secrets: bool) -> dict:
    config = stack.deploy or DeployConfig()
    k8s = config.k8s
    head_ports = [{"name": "gcs", "containerPort": GCS_PORT}, {"name": "grpc", "containerPort": k8s.router_port}]
    if k8s.http_port >= 0:
        head_ports.append({"name": "http", "containerPort": k8s.http_port})
    up = (f"ulimit -n 65536; exec specdec deploy up --config {CONFIG_FILE} --foreground "
          f'--ray-start-cmd "$KUBERAY_GEN_RAY_START_CMD"')
    join = "ulimit -n 65536; exec $KUBERAY_GEN_RAY_START_CMD"
    max_tp = max((t.tp for t in stack.targets), default=1)
    target_gpus = math.ceil(max_tp * config.targets.num_gpus)
    groups = []
    if stack.drafts:
        groups.append({"groupName": "draft", "replicas": len(stack.drafts), "minReplicas": len(stack.drafts),
                       "maxReplicas": len(stack.drafts),
                       "rayStartParams": {"resources": _ray_resources({DRAFT_RESOURCE: 1})},
                       "template": _pod(stack, "draft", k8s.drafts, join, [{"name": "grpc", "containerPort": k8s.draft_port}],
                                        k8s.draft_port, math.ceil(config.drafts.num_gpus), secrets)})
    groups.append({"groupName": "target", "replicas": len(stack.targets), "minReplicas": len(stack.targets),
                   "maxReplicas": len(stack.targets),
                   "rayStartParams": {"resources": _ray_resources({TARGET_RESOURCE: max_tp})},
                   "template": _pod(stack, "target", k8s.targets, join, [{"name": "grpc", "containerPort": k8s.target_port}],
                                    k8s.target_port, target_gpus, secrets)})
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": _meta(config, config.name, "cluster", annotations={"ray.io/overwrite-container-cmd": "true"}),
            "spec": {"rayVersion": RAY_VERSION,
                     "headGroupSpec": {"serviceType": "ClusterIP",
                                       "rayStartParams": {"include-dashboard": "false",
                                                          "resources": _ray_resources({ROUTER_RESOURCE: 1})},
                                       "template": _pod(stack, "router", k8s.head, up, head_ports, k8s.router_port,
                                                        0, secrets)},
                     "workerGroupSpecs": groups}}


def _selector(config: DeployConfig, group: str) -> dict:
    return {"matchLabels": {"ray.io/cluster": config.name, "ray.io/group": group}}


def render(stack: StackConfig, source: str | None, env: dict | None = None) -> list[dict]:
    """Every object, in the order to apply them. `env`: where secret variables are read (os.environ)."""
    import os

    env = os.environ if env is None else env
    config = stack.deploy or DeployConfig()
    k8s = config.k8s
    files = read_secret_files(stack)
    variables = {name: env[name] for name in secret_env_names(stack) if env.get(name)}
    objects = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": k8s.namespace,
                                                                      "labels": _labels(config, "namespace")}},
               {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(config, f"{config.name}-config", "config"),
                "data": {"config.yaml": config_text(stack, source)}}]
    if files:
        objects.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                        "metadata": _meta(config, f"{config.name}-files", "secret"),
                        "data": {k: base64.b64encode(v).decode() for k, v in files.items()}})
    if variables:
        objects.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                        "metadata": _meta(config, f"{config.name}-env", "secret"),
                        "data": {k: base64.b64encode(v.encode()).decode() for k, v in variables.items()}})
    objects.append(raycluster(stack, bool(files)))
    ports = [{"name": "grpc", "port": k8s.router_port, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "grpc"}]
    if k8s.http_port >= 0:
        ports.append({"name": "http", "port": k8s.http_port, "targetPort": "http", "protocol": "TCP"})
    objects.append({"apiVersion": "v1", "kind": "Service", "metadata": _meta(config, f"{config.name}-router", "router"),
                    "spec": {"type": k8s.service_type, "ports": ports,
                             "selector": {"ray.io/cluster": config.name, "ray.io/node-type": "head"}}})
    for group, replicas in (("headgroup", 1), ("draft", len(stack.drafts)), ("target", len(stack.targets))):
        if replicas:
            objects.append({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                            "metadata": _meta(config, f"{config.name}-{group}", "budget"),
                            "spec": {"minAvailable": min(k8s.pdb_min_available, replicas),
                                     "selector": _selector(config, group)}})
    return objects
