"""deploy/kubernetes: every manifest is valid Kubernetes, and the pieces fit together.

Validity: each resource against the Kubernetes API's JSON schemas for ``KUBERNETES_VERSION``, strict
(unknown fields are errors), offline: the schemas ship inside the ``kubernetes-validate`` wheel.

Fit, what a schema cannot see and a user would: every Service selects the pods of one workload on
ports those pods have; vllm-router discovers exactly the replica pods, on their HTTP port, and
health-checks their readiness endpoint; its Role lets it watch pods; the probes hit trillium's
liveness and readiness endpoints; ``--num-threads`` equals the CPU limit; kustomization.yaml lists
every manifest and names the image every container uses.
"""

from __future__ import annotations

import argparse
import pathlib
from typing import Any

import kubernetes_validate
import pytest
import yaml

KUBERNETES_VERSION = "1.30"
MANIFEST_DIR = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
WORKLOAD_KINDS = ("Deployment", "StatefulSet")

Resource = dict[str, Any]


def _load(path: pathlib.Path) -> list[Resource]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


KUSTOMIZATION = _load(MANIFEST_DIR / "kustomization.yaml")[0]
MANIFEST_FILES = sorted(p.name for p in MANIFEST_DIR.glob("*.y*ml") if p.name != "kustomization.yaml")
RESOURCES = [doc for name in MANIFEST_FILES for doc in _load(MANIFEST_DIR / name)]


def _one(kind: str, name: str) -> Resource:
    found = [r for r in RESOURCES if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name!r}, found {len(found)}"
    return found[0]


def _workloads() -> list[Resource]:
    return [r for r in RESOURCES if r["kind"] in WORKLOAD_KINDS]


def _pod_labels(workload: Resource) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def _container(workload: Resource) -> Resource:
    containers: list[Resource] = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{workload['metadata']['name']}: expected one container"
    return containers[0]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def _flag(args: list[str], flag: str) -> list[str] | None:
    """Values of ``flag`` in a container's args (``--f=v`` or ``--f v1 v2 ...``); None if absent."""
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return [arg.split("=", 1)[1]]
        if arg == flag:
            values = []
            for value in args[i + 1 :]:
                if value.startswith("--"):
                    break
                values.append(value)
            return values
    return None


def _single_flag(args: list[str], flag: str) -> str:
    values = _flag(args, flag)
    assert values is not None and len(values) == 1, f"expected one value for {flag} in {args}, got {values}"
    return values[0]


def _port_number(container: Resource, port: int | str) -> int:
    """A probe's or Service's target port, named or numeric, as the container port it is."""
    for declared in container.get("ports", []):
        if port in (declared["containerPort"], declared.get("name")):
            number: int = declared["containerPort"]
            return number
    raise AssertionError(f"container {container['name']!r} has no port {port!r}")


def _cpu_cores(quantity: str | int) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


REPLICAS = _one("StatefulSet", "trillium")
ROUTER = _one("Deployment", "trillium-router")
REPLICA = _container(REPLICAS)
ROUTER_CONTAINER = _container(ROUTER)


@pytest.mark.parametrize("resource", RESOURCES, ids=[f"{r['kind']}/{r['metadata']['name']}" for r in RESOURCES])
def test_schema(resource: Resource) -> None:
    try:
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        pytest.fail(f"{'.'.join(map(str, e.path))}: {e.message}")
    except kubernetes_validate.SchemaNotFoundError as e:
        pytest.fail(e.message)


def test_kustomization_lists_every_manifest() -> None:
    assert sorted(KUSTOMIZATION["resources"]) == MANIFEST_FILES


def test_kustomization_names_every_image() -> None:
    overridable = {image["name"] for image in KUSTOMIZATION["images"]}
    for workload in _workloads():
        container = _container(workload)
        assert container["image"].split(":")[0] in overridable, container["image"]
        assert container["imagePullPolicy"] == "IfNotPresent"


def test_one_namespace() -> None:
    namespace = KUSTOMIZATION["namespace"]
    assert _one("Namespace", namespace)
    for resource in RESOURCES:
        if resource["kind"] != "Namespace":
            assert resource["metadata"].get("namespace") == namespace, resource["metadata"]["name"]
    for subject in _one("RoleBinding", "trillium-router")["subjects"]:
        assert subject["namespace"] == namespace


def test_labels() -> None:
    for resource in RESOURCES:
        labels = resource["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/part-of") == "trillium", resource["metadata"]["name"]
        if resource["kind"] != "Namespace":
            assert labels.get("app.kubernetes.io/name") == "trillium", resource["metadata"]["name"]
            assert labels.get("app.kubernetes.io/component") in ("replica", "router"), resource["metadata"]["name"]
    for workload in _workloads():
        assert _selects(workload["spec"]["selector"]["matchLabels"], _pod_labels(workload))


def test_each_service_selects_one_workload_on_its_ports() -> None:
    for service in (r for r in RESOURCES if r["kind"] == "Service"):
        selected = [w for w in _workloads() if _selects(service["spec"]["selector"], _pod_labels(w))]
        assert len(selected) == 1, f"Service {service['metadata']['name']} selects {len(selected)} workloads"
        container = _container(selected[0])
        for port in service["spec"]["ports"]:
            _port_number(container, port.get("targetPort", port["port"]))
    headless = _one("Service", REPLICAS["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert _selects(headless["spec"]["selector"], _pod_labels(REPLICAS))


def test_replica_serves_on_its_http_port_with_probes() -> None:
    http = _port_number(REPLICA, "http")
    assert int(_single_flag(REPLICA["args"], "--port")) == http
    probes = {kind: REPLICA[kind]["httpGet"] for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == "/health/ready"
    assert probes["livenessProbe"]["path"] == "/health"
    assert probes["startupProbe"]["path"] in ("/health", "/health/ready")
    for probe in probes.values():
        assert _port_number(REPLICA, probe["port"]) == http
    startup = REPLICA["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60, "model load takes up to a minute"
    assert REPLICAS["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 30, "drain time"


def test_replica_threads_match_cpu_limit() -> None:
    limit = _cpu_cores(REPLICA["resources"]["limits"]["cpu"])
    assert int(_single_flag(REPLICA["args"], "--num-threads")) == limit


def test_router_discovers_the_replicas() -> None:
    args = ROUTER_CONTAINER["args"]
    assert _flag(args, "--service-discovery") == []
    selector = dict(item.split("=", 1) for item in _flag(args, "--selector") or [])
    assert selector, "--selector is missing"
    assert _selects(selector, _pod_labels(REPLICAS))
    assert not _selects(selector, _pod_labels(ROUTER)), "the router would discover itself"
    assert int(_single_flag(args, "--service-discovery-port")) == _port_number(REPLICA, "http")
    assert _single_flag(args, "--health-check-endpoint") == "/health/ready"
    namespace = _single_flag(args, "--service-discovery-namespace")
    if namespace.startswith("$("):
        env = {e["name"]: e for e in ROUTER_CONTAINER["env"]}
        assert env[namespace[2:-1]]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    else:
        assert namespace == REPLICAS["metadata"]["namespace"]


def test_router_probes_its_own_health() -> None:
    port = int(_single_flag(ROUTER_CONTAINER["args"], "--port"))
    for kind in ("readinessProbe", "livenessProbe"):
        probe = ROUTER_CONTAINER[kind]["httpGet"]
        assert probe["path"] == "/health"
        assert _port_number(ROUTER_CONTAINER, probe["port"]) == port
    metrics = int(_single_flag(ROUTER_CONTAINER["args"], "--prometheus-port"))
    assert _port_number(ROUTER_CONTAINER, "metrics") == metrics


def test_router_may_watch_pods() -> None:
    account = ROUTER["spec"]["template"]["spec"]["serviceAccountName"]
    assert _one("ServiceAccount", account)
    bindings = [
        b
        for b in RESOURCES
        if b["kind"] == "RoleBinding"
        and any(s["kind"] == "ServiceAccount" and s["name"] == account for s in b["subjects"])
    ]
    assert bindings, f"no RoleBinding for ServiceAccount {account}"
    granted: set[str] = set()
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        for rule in _one("Role", binding["roleRef"]["name"])["rules"]:
            if "" in rule["apiGroups"] and "pods" in rule["resources"]:
                granted.update(rule["verbs"])
    assert {"get", "list", "watch"} <= granted


def test_router_args_parse_with_vllm_router() -> None:
    """The flags are spelled as the installed vllm-router reads them (skipped without it)."""
    router_args = pytest.importorskip("vllm_router.router_args")
    parser = argparse.ArgumentParser()
    router_args.RouterArgs.add_cli_args(parser)
    parsed = router_args.RouterArgs.from_cli_args(parser.parse_args(ROUTER_CONTAINER["args"]))
    assert parsed.service_discovery
    assert _selects(parsed.selector, _pod_labels(REPLICAS))
    assert parsed.service_discovery_port == _port_number(REPLICA, "http")
    assert parsed.health_check_endpoint == "/health/ready"
