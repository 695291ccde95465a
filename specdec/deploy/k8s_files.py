"""`make deploy K8S=1`: render, validate offline, write under deploy/k8s/<name>/, and apply with kubectl
when a cluster answers (otherwise say how to apply). Files are numbered in the order to apply them;
the Secrets (`20-secret-*.yaml`) carry key material and are git-ignored."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from specdec.deploy.config import DeployConfig
from specdec.serving_config import StackConfig

ORDER = {"Namespace": 0, "ConfigMap": 10, "Secret": 20, "RayCluster": 30, "Service": 40, "PodDisruptionBudget": 50}
KUBERAY_HINT = ("the KubeRay operator (v1.4 or later) must run in the cluster: helm repo add kuberay "
                "https://ray-project.github.io/kuberay-helm/ && helm install kuberay-operator kuberay/kuberay-operator")


def file_name(obj: dict) -> str:
    return f"{ORDER[obj['kind']]:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


def dump_yaml(obj: dict) -> str:
    """YAML for people: no anchors, multi-line strings (the embedded config) as literal blocks."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data) -> bool:
            return True

    def text(dumper, value: str):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    return yaml.dump(obj, Dumper=Dumper, sort_keys=False)


def write(objects: list[dict], directory: Path) -> list[Path]:
    """One file per object; files of an earlier render that this one no longer has are removed."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for obj in objects:
        path = directory / file_name(obj)
        path.write_text(dump_yaml(obj))
        written.append(path)
    for stale in set(directory.glob("[0-9][0-9]-*.yaml")) - set(written):
        stale.unlink()
    return written


def kubectl(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess | None:
    """kubectl's result, or None when there is no kubectl."""
    if shutil.which("kubectl") is None:
        return None
    return subprocess.run(["kubectl", *args], capture_output=True, text=True, timeout=timeout_s)


def reachable() -> tuple[bool, str]:
    """(whether a cluster answers, why not)."""
    result = kubectl("version", "--request-timeout=5s", timeout_s=15.0)
    if result is None:
        return False, "no kubectl on this machine"
    if result.returncode != 0:
        return False, f"kubectl reaches no cluster ({(result.stderr or result.stdout).strip().splitlines()[-1:]})"
    return True, ""


def validate(objects: list[dict]) -> str:
    """Offline validation when its tools are installed (the [dev] extra); what was checked."""
    try:
        from specdec.deploy.k8s_validate import validate_all
    except ImportError:
        return "not validated offline (kubernetes-validate is not installed)"
    return validate_all(objects)


def up_k8s(stack: StackConfig, source: str | None, out: str) -> int:
    from specdec.deploy.k8s import render
    from specdec.deploy.k8s_config import binds_beyond_loopback

    config = stack.deploy or DeployConfig()
    objects = render(stack, source)
    checked = validate(objects)
    directory = Path(out) / config.name
    paths = write(objects, directory)
    print(f"wrote {len(paths)} manifests to {directory}/ ({checked})")
    if not binds_beyond_loopback(stack):
        print("note: this version's servers bind 127.0.0.1 only (no `host` key yet): across pods they need it")
    ok, why = reachable()
    if not ok:
        print(f"not applied: {why}. To apply: kubectl apply -f {directory}/ ({KUBERAY_HINT}); the image "
              f"{config.k8s.image} must be built and pushed first (deploy/docker/).")
        return 0
    crd = kubectl("get", "crd", "rayclusters.ray.io")
    if crd.returncode != 0:
        print(f"not applied: no RayCluster kind in this cluster; {KUBERAY_HINT}")
        return 2
    result = kubectl("apply", "-f", str(directory), timeout_s=120.0)
    print(result.stdout + result.stderr, end="")
    if result.returncode == 0:
        print(f"applied; the router's Service is {config.name}-router.{config.k8s.namespace}:{config.k8s.router_port} "
              f"(`make status K8S=1`)")
    return 0 if result.returncode == 0 else 2


def down_k8s(stack: StackConfig, out: str) -> int:
    config = stack.deploy or DeployConfig()
    directory = Path(out) / config.name
    ok, why = reachable()
    if not ok:
        print(f"nothing deleted: {why}. To delete: kubectl delete -f {directory}/")
        return 0
    result = kubectl("delete", "--ignore-not-found", "--wait=false", "-f", str(directory), timeout_s=120.0)
    print(result.stdout + result.stderr, end="")
    return 0 if result.returncode == 0 else 2


def status_k8s(stack: StackConfig) -> int:
    config = stack.deploy or DeployConfig()
    ok, why = reachable()
    if not ok:
        print(f"no status: {why}")
        return 0
    result = kubectl("get", "raycluster,pods,services,poddisruptionbudgets", "-n", config.k8s.namespace,
                     "-l", f"specdec.io/deployment={config.name}", "-o", "wide")
    print(result.stdout + result.stderr, end="")
    pods = kubectl("get", "pods", "-n", config.k8s.namespace, "-l", f"ray.io/cluster={config.name}", "-o", "wide")
    print(pods.stdout + pods.stderr, end="")
    return 0 if result.returncode == 0 else 2
