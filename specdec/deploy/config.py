"""The `deploy:` section of a deployment file: what a cluster needs beyond the serving configs.

Placement uses Ray custom resources, one unit per process: the router needs `specdec_router`, each
draft worker `specdec_draft`, each tensor-parallel rank of a target `specdec_target` (a target's ranks
form one STRICT_PACK placement group, so they share a node). A node offers as many units as it should
host processes of that kind: `ray start --resources '{"specdec_target": 2}'`; the local cluster and
the KubeRay manifests set them from this config.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from specdec.errors import InvalidArgument
from specdec.serving_config import build_config

ROUTER_RESOURCE, DRAFT_RESOURCE, TARGET_RESOURCE = "specdec_router", "specdec_draft", "specdec_target"


@dataclass(frozen=True)
class ProcessResources:
    """What Ray reserves for one process (a target: per tensor-parallel rank)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0

    def __post_init__(self) -> None:
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise InvalidArgument(f"invalid resources {self}")


@dataclass(frozen=True)
class PodGroup:
    """A Kubernetes pod of one kind (head: the router; draft; target): container requests and placement."""

    cpu: str = "2"  # Kubernetes quantities, as in a pod spec
    memory: str = "8Gi"
    node_selector: dict = field(default_factory=dict)  # e.g. {"nvidia.com/gpu.present": "true"}
    tolerations: tuple = ()  # pod tolerations, as in a pod spec, e.g. {key: nvidia.com/gpu, operator: Exists, ...}


@dataclass(frozen=True)
class K8sConfig:
    image: str = "specdec:0.1.0-cpu"  # built from deploy/docker (Dockerfile: -cuda, Dockerfile.cpu: -cpu)
    image_pull_policy: str = "IfNotPresent"
    namespace: str = "specdec"
    # Fixed ports inside the pods (port 0 cannot be probed or put behind a Service).
    router_port: int = 50051
    http_port: int = 8000  # the OpenAI-compatible API; -1 = none
    target_port: int = 50052
    draft_port: int = 50053
    service_type: str = "ClusterIP"  # the router's Service: ClusterIP | NodePort | LoadBalancer
    startup_timeout_s: int = 1200  # startup probe: model download / loading may take this long
    pdb_min_available: int = 1  # PodDisruptionBudget per worker group (voluntary evictions keep this many)
    gpu_resource: str = "nvidia.com/gpu"
    head: PodGroup = PodGroup(cpu="2", memory="8Gi")
    drafts: PodGroup = PodGroup(cpu="2", memory="8Gi")
    targets: PodGroup = PodGroup(cpu="4", memory="32Gi")

    def __post_init__(self) -> None:
        if self.service_type not in ("ClusterIP", "NodePort", "LoadBalancer") or self.startup_timeout_s < 10:
            raise InvalidArgument(f"invalid k8s config {self}")


@dataclass(frozen=True)
class DeployConfig:
    name: str = "specdec"  # prefix of actor, placement group and Kubernetes object names
    namespace: str = "specdec"  # Ray namespace of the actors
    ray_address: str | None = None  # None = env RAY_ADDRESS, else a local cluster on 127.0.0.1 (started once)
    max_restarts: int = -1  # Ray restarts a dead worker this many times (-1 = always)
    object_store_mb: int = 200  # the local cluster's object store (the stack passes no large objects)
    router: ProcessResources = ProcessResources()
    drafts: ProcessResources = ProcessResources()
    targets: ProcessResources = ProcessResources()  # per tensor-parallel rank
    env: dict = field(default_factory=dict)  # extra environment of every serving process
    k8s: K8sConfig = K8sConfig()

    def __post_init__(self) -> None:
        if not self.name.replace("-", "").isalnum() or not self.name[0].isalpha() or self.name != self.name.lower():
            raise InvalidArgument(f"deploy.name {self.name!r}: lower-case letters, digits and '-' (a DNS label)")
        if self.max_restarts < -1 or self.object_store_mb < 50:
            raise InvalidArgument(f"invalid deploy config: max_restarts {self.max_restarts}, "
                                  f"object_store_mb {self.object_store_mb} (at least 50)")
        if not all(isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in self.env.items()):
            raise InvalidArgument("deploy.env must map names to strings")


NESTED = {DeployConfig: {"router": ProcessResources, "drafts": ProcessResources, "targets": ProcessResources,
                         "k8s": K8sConfig},
          K8sConfig: {"head": PodGroup, "drafts": PodGroup, "targets": PodGroup}}


def build_nested(cls, values, where: str, base=None):
    """build_config for a dataclass whose fields are themselves config dataclasses (NESTED). A nested
    mapping overrides only the keys it names: the rest keep their defaults at that place."""
    base = cls() if base is None else base
    if values is None:
        return base
    if not isinstance(values, dict):
        raise InvalidArgument(f"{where} must be a mapping, got {type(values).__name__}")
    inner = NESTED.get(cls, {})
    build_config(cls, {k: v for k, v in values.items() if k not in inner}, where)  # refuses unknown keys
    changes = {k: build_nested(inner[k], v, f"{where}.{k}", getattr(base, k)) if k in inner
               else tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return dataclasses.replace(base, **changes)
