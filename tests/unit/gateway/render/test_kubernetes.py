"""gateway.render.kubernetes: every rendered object validates against the schemas of a pinned
Kubernetes version (kubernetes-validate, strict: unknown fields are errors), and the manifests
wire what the deployment needs (probes, GPUs, secrets by reference, the fleet as a ConfigMap,
Prometheus' configuration passing promtool). No cluster is needed."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from config.fleet import Fleet, parse_fleet
from gateway.render.blueprint import Rendered, make_blueprint
from gateway.render.kubernetes import KEYS_SECRET, render_kubernetes
from tests.unit.gateway.render.fleets import FLEETS, ROOT, SECRETS, assets, rich_fleet, rich_raw

KUBERNETES_VERSION = "1.37.0"
"""The Kubernetes release whose schemas the manifests must pass (the newest one the pinned
kubernetes-validate ships)."""

pytestmark = pytest.mark.timeout(300)


def render(fleet: Fleet) -> Rendered:
    return render_kubernetes(make_blueprint(fleet), assets())


def objects(rendered: Rendered) -> list[dict[str, Any]]:
    return [o for name, text in sorted(rendered.files.items()) if name != "kustomization.yaml"
            for o in yaml.safe_load_all(text)]


@pytest.fixture(scope="module")
def rich() -> list[dict[str, Any]]:
    return objects(render(rich_fleet()))


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


@pytest.mark.parametrize("fleet", sorted(FLEETS))
def test_every_object_validates(fleet: str) -> None:
    for obj in objects(render(FLEETS[fleet]())):
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_validator_sees_a_mistake(rich: list[dict[str, Any]]) -> None:
    broken = find(rich, "Deployment", "ridge")
    broken = {**broken, "spec": {**broken["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_file_and_objects_share_the_namespace() -> None:
    rendered = render(rich_fleet())
    kustomization = yaml.safe_load(rendered.files["kustomization.yaml"])
    assert kustomization["resources"] == sorted(set(rendered.files) - {"kustomization.yaml"})
    objs = objects(rendered)
    assert {o["metadata"].get("namespace", "ridge") for o in objs} == {"ridge"}
    assert objs[0]["kind"] == "Namespace"


def test_a_pool_is_a_deployment_a_headless_service_and_a_budget(
        rich: list[dict[str, Any]]) -> None:
    deployment = find(rich, "Deployment", "engine-sgl-decode")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["annotations"]["ridge-pool"] == "sgl-decode"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["python3", "-m", "sglang.launch_server"]
    assert container["args"][container["args"].index("--api-key") + 1] == "$(SGL_KEY)"
    assert {"name": "SGL_KEY", "valueFrom": {"secretKeyRef": {
        "name": KEYS_SECRET, "key": "SGL_KEY"}}} in container["env"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    service = find(rich, "Service", "engine-sgl-prefill")
    assert service["spec"]["clusterIP"] == "None"
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"http": 30000,
                                                                      "bootstrap": 8998}
    assert find(rich, "PodDisruptionBudget", "engine-sgl-decode")["spec"]["maxUnavailable"] == 1


def test_engine_arguments_are_escaped_and_gpus_counted(rich: list[dict[str, Any]]) -> None:
    pod = find(rich, "Deployment", "engine-general-pool-v2")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][-1] == "$$(HOME)/t.jinja ${X}"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2


def test_ridge_reads_the_fleet_with_in_cluster_endpoints(rich: list[dict[str, Any]]) -> None:
    fleet_yaml = find(rich, "ConfigMap", "ridge-fleet")["data"]["fleet.yaml"]
    fleet = parse_fleet(yaml.safe_load(fleet_yaml))
    assert fleet.pool("sgl-decode").endpoint_urls() == [
        "http://engine-sgl-decode.ridge.svc.cluster.local:30000"]
    # every pool's Service name is resolved at every poll: one endpoint per ready pod
    assert {p.resolve for p in fleet.pools} == {"dns"}
    source = rich_fleet()
    assert [p.name for p in fleet.pools] == [p.name for p in source.pools]
    assert all(len(p.endpoints) == 1 for p in fleet.pools)
    deployment = find(rich, "Deployment", "ridge")
    template = deployment["spec"]["template"]
    assert template["metadata"]["annotations"]["ridge/fleet-sha256"] == hashlib.sha256(
        fleet_yaml.encode()).hexdigest()
    (container,) = template["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    env = {e["name"]: e for e in container["env"]}
    assert env["RIDGE_REDIS_URL"]["value"] == "redis://redis:6379/0"
    # a reload (SIGHUP, POST /admin/reload) reads the file the gateway was started with
    config = container["args"][container["args"].index("--config") + 1]
    assert env["RIDGE_CONFIG"]["value"] == config == "/etc/ridge/fleet.yaml"
    assert set(SECRETS) <= set(env)
    assert template["spec"]["securityContext"]["runAsNonRoot"] is True
    assert deployment["spec"]["replicas"] == 2
    assert find(rich, "PodDisruptionBudget", "ridge")["spec"]["maxUnavailable"] == 1


def test_no_rendered_file_holds_a_key() -> None:
    text = "".join(render(rich_fleet()).files.values())
    assert not [v for v in SECRETS.values() if v in text]
    assert "kind: Secret\n" not in text


def test_prometheus_config_passes_promtool(rich: list[dict[str, Any]], tmp_path: Path) -> None:
    data = find(rich, "ConfigMap", "prometheus")["data"]
    (tmp_path / "rules").mkdir()
    for key, text in data.items():
        (tmp_path / ("" if key == "prometheus.yml" else "rules") / key).write_text(text)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: bash deploy/apt-install.sh prometheus")
    done = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    ridge, engines = yaml.safe_load(data["prometheus.yml"])["scrape_configs"]
    assert (ridge["job_name"], engines["job_name"]) == ("ridge", "ridge-engines")
    headless = {f"{o['metadata']['name']}.ridge.svc.cluster.local": o for o in rich
                if o["kind"] == "Service" and o["spec"].get("clusterIP") == "None"}
    (ridge_host,) = ridge["dns_sd_configs"][0]["names"]
    assert ridge_host in headless and ridge["dns_sd_configs"][0]["port"] == 9091
    hosts = [n for c in engines["dns_sd_configs"] for n in c["names"]]
    assert set(hosts) | {ridge_host} == set(headless)
    pools = {r["regex"]: r["replacement"] for r in engines["relabel_configs"]
             if r["target_label"] == "pool"}
    assert pools[r"engine\-sgl\-decode\.ridge\.svc\.cluster\.local"] == "sgl-decode"


def test_grafana_gets_the_projects_dashboards(rich: list[dict[str, Any]]) -> None:
    data = find(rich, "ConfigMap", "grafana-ridge-dashboards")["data"]
    shipped = {p.name: p.read_text() for p in (ROOT / "grafana" / "dashboards").glob("*.json")}
    assert data == shipped
    assert sum(len(t.encode()) for t in data.values()) < 1024 * 1024  # a ConfigMap's limit


def test_grafanas_admin_password_comes_from_a_required_secret(
        rich: list[dict[str, Any]]) -> None:
    pod = find(rich, "Deployment", "grafana")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    ref = env["GF_SECURITY_ADMIN_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "ridge-grafana", "key": "admin-password"}  # not optional


def test_kv_event_ports_are_declared_and_streams_follow_each_pod() -> None:
    raw = rich_raw()
    raw["pools"][0]["kv_events"] = {"port": 5557, "replay_port": 5558,
                                    "addresses": ["tcp://a:6001", "tcp://b:6001"]}
    objs = objects(render(parse_fleet(raw)))
    for obj in objs:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    pod = find(objs, "Deployment", "engine-general-pool-v2")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"name": "kv-events", "containerPort": 5557} in container["ports"]
    assert {"name": "kv-replay", "containerPort": 5558} in container["ports"]
    service = find(objs, "Service", "engine-general-pool-v2")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "http": 8000, "kv-events": 5557, "kv-replay": 5558}
    fleet = parse_fleet(yaml.safe_load(find(objs, "ConfigMap", "ridge-fleet")["data"]
                                       ["fleet.yaml"]))
    general = fleet.pool("General_Pool.v2")
    assert general.resolve == "dns" and general.kv_events is not None
    assert general.kv_events.addresses is None  # each resolved pod address publishes
    assert general.kv_event_sources(["http://10.1.2.3:8000"])["http://10.1.2.3:8000"] == (
        "tcp://10.1.2.3:5557", "tcp://10.1.2.3:5558", "")
