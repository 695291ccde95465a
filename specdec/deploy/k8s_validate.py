"""Offline validation of the rendered manifests, with no cluster: built-in kinds against the Kubernetes
OpenAPI schemas that `kubernetes-validate` ships (strict: an unknown field is an error), the
RayCluster against KubeRay's published CRD schema, vendored under deploy/vendor/kuberay with its
license. A CRD schema allows unknown fields (the API server prunes them silently), so fields the
schema does not declare are refused here, as `kubectl apply --validate=strict` would."""
from __future__ import annotations

import functools
from pathlib import Path

from specdec.errors import InvalidArgument

VENDORED = Path(__file__).resolve().parents[2] / "deploy" / "vendor" / "kuberay"
KUBERAY_VERSION = "v1.5.2"
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml"}


@functools.lru_cache(maxsize=None)
def crd_schema(kind: str, api_version: str = "v1") -> dict:
    """openAPIV3Schema of the vendored CRD for `kind` at `api_version`."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load((VENDORED / CRD_FILES[kind]).read_text(), Loader=loader)
    for version in crd["spec"]["versions"]:
        if version["name"] == api_version:
            return version["schema"]["openAPIV3Schema"]
    raise InvalidArgument(f"the vendored {kind} CRD has no version {api_version}")


def unknown_fields(value, schema: dict, path: str = "") -> list[str]:
    """Paths of fields that `schema` does not declare (where it declares its properties)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found = []
    if isinstance(value, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            if properties is not None and key in properties:
                found += unknown_fields(item, properties[key], where)
            elif isinstance(extra, dict):
                found += unknown_fields(item, extra, where)
            elif properties is not None:
                found.append(where)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            found += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return found


def validate_custom(obj: dict) -> list[str]:
    import jsonschema

    group_version = obj["apiVersion"].split("/")
    schema = crd_schema(obj["kind"], group_version[-1])
    errors = [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
              for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]
    errors += [f"{p}: unknown field" for p in unknown_fields(obj, schema)]
    return errors


def validate_builtin(obj: dict, version: str) -> list[str]:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(str(p) for p in exc.path)}: {exc.message}"]
    return []


def validate_all(objects: list[dict]) -> str:
    """Raise InvalidArgument naming every problem; return what the objects were checked against."""
    from kubernetes_validate.utils import latest_version

    version = latest_version()
    problems = []
    for obj in objects:
        custom = obj["kind"] in CRD_FILES
        errors = validate_custom(obj) if custom else validate_builtin(obj, version)
        problems += [f"{obj['kind']}/{obj['metadata']['name']}: {e}" for e in errors]
    if problems:
        raise InvalidArgument("the rendered manifests do not validate:\n  " + "\n  ".join(problems))
    return (f"validated offline against the Kubernetes {version} schemas (strict) and KubeRay "
            f"{KUBERAY_VERSION}'s RayCluster CRD")
