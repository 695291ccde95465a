"""`make deploy K8S=1`'s manifests, offline: built-in kinds against the Kubernetes schemas (strict), the
RayCluster against KubeRay's vendored CRD (unknown fields refused), the validators themselves shown to
refuse broken objects, the committed manifests fresh, and what the pods are promised: the config they
read, probes, grace, GPUs, placement, secrets."""
from __future__ import annotations

import base64
import copy
import dataclasses
import datetime
from pathlib import Path

import pytest
import yaml

from specdec.deploy import k8s_files
from specdec.deploy.k8s import render
from specdec.deploy.k8s_config import SECRETS_DIR
from specdec.deploy.k8s_validate import validate_all
from specdec.errors import InvalidArgument
from specdec.serving_config import StackConfig, load_stack_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ("deploy/configs/local.yaml", "deploy/configs/k8s-gpu.yaml")


def objects_of(objects: list[dict]) -> dict[str, dict]:
    return {o["kind"] if o["kind"] != "PodDisruptionBudget" else f"PDB/{o['metadata']['name']}": o for o in objects}


@pytest.mark.parametrize("source", CONFIGS)
def test_the_committed_manifests_validate_offline_and_are_what_the_config_renders(source, tmp_path):
    stack = load_stack_config(ROOT / source)
    objects = render(stack, source, env={})
    assert "RayCluster" in validate_all(objects)
    written = k8s_files.write(objects, tmp_path)
    committed = ROOT / "deploy" / "k8s" / stack.deploy.name
    for path in written:
        assert (committed / path.name).read_text() == path.read_text(), (
            f"deploy/k8s is stale: run `make deploy K8S=1 CONFIG={source}`")
    assert sorted(p.name for p in committed.glob("*.yaml")) == sorted(p.name for p in written)


def test_the_validators_refuse_broken_objects():
    objects = render(load_stack_config(ROOT / CONFIGS[1]), CONFIGS[1], env={})
    for damage, expected in (
            (lambda o: o["RayCluster"]["spec"]["workerGroupSpecs"][0].update(replicas="two"), "not of type 'integer'"),
            (lambda o: o["RayCluster"]["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
             ["startupProbe"]["grpc"].update(portt=1), "startupProbe.grpc.portt: unknown field"),
            (lambda o: o["Service"]["spec"].update(selectorr={}), "selectorr"),
            (lambda o: o["ConfigMap"].update(data=[1]), "ConfigMap")):
        broken = copy.deepcopy(objects)
        damage(objects_of(broken))
        with pytest.raises(InvalidArgument, match=expected):
            validate_all(broken)


def test_pods_get_the_same_config_with_fixed_ports_probes_grace_gpus_and_placement():
    stack = load_stack_config(ROOT / CONFIGS[1])
    k8s = stack.deploy.k8s
    found = objects_of(render(stack, CONFIGS[1], env={}))
    pod_config = yaml.safe_load(found["ConfigMap"]["data"]["config.yaml"])
    inside = load_stack_config_text(pod_config)
    assert (inside.router.port, inside.targets[0].port, [d.port for d in inside.drafts]) == (
        k8s.router_port, k8s.target_port, [k8s.draft_port] * 2)
    assert inside.deploy == stack.deploy and [d.drafter for d in inside.drafts] == ["suffix", "suffix"]
    cluster = found["RayCluster"]["spec"]
    head = cluster["headGroupSpec"]
    assert '{\\"specdec_router\\": 1}' in head["rayStartParams"]["resources"]
    [head_container] = head["template"]["spec"]["containers"]
    assert "specdec deploy up" in head_container["args"][0] and "$KUBERAY_GEN_RAY_START_CMD" in head_container["args"][0]
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    assert groups["draft"]["replicas"] == 2 and groups["target"]["replicas"] == 1
    target_pod = groups["target"]["template"]["spec"]
    [target] = target_pod["containers"]
    assert target["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert target_pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert target_pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert "nvidia.com/gpu" not in groups["draft"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    for container, port in ((head_container, k8s.router_port), (target, k8s.target_port)):
        assert container["readinessProbe"]["grpc"]["port"] == port == container["livenessProbe"]["grpc"]["port"]
        startup = container["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= k8s.startup_timeout_s
    for pod in (head["template"]["spec"], target_pod):
        assert pod["terminationGracePeriodSeconds"] >= 30  # the servers' drain (30 s until drain_timeout_s exists)
    service = found["Service"]["spec"]
    assert service["selector"] == {"ray.io/cluster": "specdec-gpu", "ray.io/node-type": "head"}
    assert {p["name"]: p["port"] for p in service["ports"]} == {"grpc": 50051, "http": 8000}
    budgets = {k: o["spec"] for k, o in found.items() if k.startswith("PDB/")}
    assert {b["selector"]["matchLabels"]["ray.io/group"] for b in budgets.values()} == {"headgroup", "draft", "target"}


def load_stack_config_text(data: dict) -> StackConfig:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(data, f)
        f.flush()
        return load_stack_config(f.name)


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "specdec-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    return tmp_path / "cert.pem", tmp_path / "key.pem"


def test_certificates_keys_and_tokens_travel_as_secrets_and_the_pods_config_names_their_mounts(tmp_path):
    cert, key = self_signed(tmp_path)
    keys = tmp_path / "api_keys"
    keys.write_text("k1\n")
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    config = yaml.safe_load((ROOT / CONFIGS[0]).read_text())
    config["security"] = {"tls_cert_file": str(cert), "tls_key_file": str(key), "tls_ca_file": str(cert),
                          "token_file": str(token)}
    config.setdefault("router", {})["api_keys_file"] = str(keys)
    (tmp_path / "secure.yaml").write_text(yaml.safe_dump(config))
    stack = load_stack_config(tmp_path / "secure.yaml")  # every component gets the section's files
    objects = render(stack, "test", env={"SPECDEC_ADMIN_KEYS": "adm", "SPECDEC_API_KEYS": "a,b", "OTHER": "x"})
    validate_all(objects)
    secrets = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "Secret"}
    files, env = secrets["specdec-files"], secrets["specdec-env"]
    assert base64.b64decode(files["security-tls-key-file"]) == key.read_bytes()
    assert base64.b64decode(files["security-tls-cert-file"]) == cert.read_bytes()
    assert base64.b64decode(files["security-token-file"]) == b"t0ken\n"
    assert "security-tls-ca-file" not in files  # the same file as the certificate: one copy
    assert base64.b64decode(files["router-api-keys-file"]) == b"k1\n"
    assert {k: base64.b64decode(v).decode() for k, v in env.items()} == {"SPECDEC_ADMIN_KEYS": "adm", "SPECDEC_API_KEYS": "a,b"}
    pod_config = yaml.safe_load(objects_of(objects)["ConfigMap"]["data"]["config.yaml"])
    assert pod_config["security"]["tls_key_file"] == f"{SECRETS_DIR}/security-tls-key-file"
    assert pod_config["security"]["tls_ca_file"] == f"{SECRETS_DIR}/security-tls-cert-file"
    assert "security" not in pod_config["router"]  # the file's section, written once at the top
    assert pod_config["router"]["api_keys_file"] == f"{SECRETS_DIR}/router-api-keys-file"
    [head] = objects_of(objects)["RayCluster"]["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    assert {"name": "secrets", "mountPath": SECRETS_DIR, "readOnly": True} in head["volumeMounts"]
    # TLS: the kubelet's plaintext gRPC probe cannot connect; the probe presents the config's credentials
    assert head["readinessProbe"]["exec"]["command"][:3] == ["python", "-m", "specdec.rpc.health_probe"]
    assert str(tmp_path) not in yaml.safe_dump(objects)  # no local path leaks into the manifests
    assert "20-secret-specdec-files.yaml" in {k8s_files.file_name(o) for o in objects}  # git-ignored name


def test_without_a_cluster_up_k8s_writes_and_says_how_to_apply(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no kubectl
    stack = load_stack_config(ROOT / CONFIGS[0])
    assert k8s_files.up_k8s(stack, CONFIGS[0], str(tmp_path / "k8s")) == 0
    out = capsys.readouterr().out
    assert f"kubectl apply -f {tmp_path / 'k8s' / 'specdec'}/" in out and "no kubectl" in out
    assert len(list((tmp_path / "k8s" / "specdec").glob("*.yaml"))) == 7
