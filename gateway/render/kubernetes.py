"""The Kubernetes target: plain manifests, one file per component, and a kustomization.

Objects, all in one namespace and labelled ``app.kubernetes.io/part-of: ridge``: per pool a
Deployment, a headless Service ``engine-POOL`` and a PodDisruptionBudget; ridge's fleet file
as a ConfigMap (endpoints rewritten to the engines' headless Services with ``resolve: dns``),
its Deployment, Services and PodDisruptionBudget, and Redis; Prometheus and Grafana.

Secrets are referenced, never rendered: the engines' API keys from the Secret
:data:`KEYS_SECRET` as ``--api-key $(VAR)``, ``HF_TOKEN`` from :data:`HF_SECRET`.
See docs/gateway.md#kubernetes and docs/deploy.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from backends.launch.args import Arg, EnvRef
from backends.registry.resolver import DNS
from config.fleet import parse_fleet
from gateway.render.assets import Assets
from gateway.render.blueprint import (
    FLEET_DIR,
    FLEET_FILE,
    GRAFANA_PORT,
    HF_CACHE,
    HF_TOKEN,
    PROMETHEUS_PORT,
    REDIS_PORT,
    RIDGE_ADMIN_PORT,
    RIDGE_PORT,
    Blueprint,
    EngineBlueprint,
    Rendered,
    rendered_fleet,
    to_yaml,
)
from gateway.render.monitoring import METRICS_PORT_NAME, POOL_ANNOTATION, kubernetes_config

KEYS_SECRET = "ridge-engine-keys"
RIDGE_METRICS = "ridge-metrics"  # headless: one DNS record per gateway replica, for Prometheus
HF_SECRET = "ridge-hf-token"
GRAFANA_SECRET = "ridge-grafana"  # key admin-password: Grafana's admin password, never admin
POOL_LABEL = "ridge-pool"
PART_OF = "ridge"
KUSTOMIZATION = "kustomization.yaml"
DASHBOARDS_MOUNT = "/var/lib/grafana/dashboards/ridge"
ENGINE_STARTUP_S = 1800  # how long an engine may take to download and load its checkpoint
Obj = dict[str, Any]


def render_kubernetes(blueprint: Blueprint, assets: Assets) -> Rendered:
    """The manifests of ``blueprint``, by file (applied in file-name order)."""
    fleet, warnings = resolved_fleet(blueprint)
    groups = {
        "00-namespace.yaml": [namespace(blueprint)],
        "10-redis.yaml": redis(blueprint),
        **{f"20-{e.name}.yaml": engine_objects(blueprint, e) for e in blueprint.engines},
        "30-ridge.yaml": ridge_objects(blueprint, to_yaml(fleet)),
        "40-prometheus.yaml": prometheus_objects(blueprint, assets),
        "50-grafana.yaml": grafana_objects(blueprint, assets),
    }
    files = {name: to_yaml(*objs) for name, objs in groups.items()}
    files[KUSTOMIZATION] = to_yaml({"apiVersion": "kustomize.config.k8s.io/v1beta1",
                                  "kind": "Kustomization", "resources": sorted(files)})
    return Rendered(files, warnings, blueprint.secrets())


def resolved_fleet(blueprint: Blueprint) -> tuple[dict[str, Any], list[str]]:
    """The deployed gateway's fleet file: every pool one endpoint, its headless Service's URL,
    resolved at every poll into one endpoint per ready pod (``resolve: dns``); and warnings."""
    fleet, warnings = rendered_fleet(blueprint, {e.pool.name: [service_url(blueprint, e)]
                                            for e in blueprint.engines})
    for pool in fleet["pools"]:
        pool["resolve"] = DNS
    parse_fleet(fleet, source="rendered fleet")  # the deployed gateway must accept it
    return fleet, warnings


def service_host(blueprint: Blueprint, name: str) -> str:
    """The cluster DNS name of the Service ``name``."""
    return f"{name}.{blueprint.options.namespace}.svc.cluster.local"


def service_url(blueprint: Blueprint, engine: EngineBlueprint) -> str:
    """The in-cluster URL of a pool's headless Service."""
    return f"http://{service_host(blueprint, engine.name)}:{engine.port}"


def meta(blueprint: Blueprint, name: str, component: str) -> Obj:
    """``metadata`` of the object ``name`` of ``component``."""
    return {"name": name, "namespace": blueprint.options.namespace,
            "labels": {**selector(component, name), "app.kubernetes.io/part-of": PART_OF}}


def selector(component: str, name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/component": component}


def namespace(blueprint: Blueprint) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": blueprint.options.namespace,
                         "labels": {"app.kubernetes.io/part-of": PART_OF}}}


def deployment(blueprint: Blueprint, name: str, component: str, replicas: int, pod: Obj,
               pod_meta: Mapping[str, Mapping[str, str]] | None = None,
               strategy: Obj | None = None) -> Obj:
    """A Deployment of ``replicas`` pods ``pod`` (a PodSpec)."""
    template_meta = {"labels": {**selector(component, name), "app.kubernetes.io/part-of": PART_OF,
                                **(pod_meta or {}).get("labels", {})}}
    if pod_meta and "annotations" in pod_meta:
        template_meta["annotations"] = dict(pod_meta["annotations"])
    spec: Obj = {"replicas": replicas, "selector": {"matchLabels": selector(component, name)},
                 "template": {"metadata": template_meta, "spec": pod}}
    if strategy is not None:
        spec["strategy"] = strategy
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": meta(blueprint, name, component), "spec": spec}


def service(blueprint: Blueprint, name: str, component: str, ports: Mapping[str, int],
            headless: bool = False, pods: str | None = None) -> Obj:
    """A Service of the pods of ``pods`` (default: of ``name``)."""
    spec: Obj = {"selector": selector(component, pods or name),
                 "ports": [{"name": n, "port": p, "targetPort": n} for n, p in ports.items()]}
    if headless:
        spec["clusterIP"] = "None"
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta(blueprint, name, component),
            "spec": spec}


def disruption_budget(blueprint: Blueprint, name: str, component: str) -> Obj:
    """At most one pod of ``name`` voluntarily down at a time (drains, node upgrades)."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": meta(blueprint, name, component),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(component, name)}}}


def config_map(blueprint: Blueprint, name: str, component: str, data: Mapping[str, str]) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(blueprint, name, component),
            "data": dict(data)}


def http_probe(path: str, port: str, period_s: int, failures: int) -> Obj:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period_s,
            "timeoutSeconds": 5, "failureThreshold": failures}


def container_ports(ports: Mapping[str, int]) -> list[Obj]:
    return [{"name": n, "containerPort": p} for n, p in ports.items()]


def secret_env(names: Sequence[str]) -> list[Obj]:
    """Environment variables taken from :data:`KEYS_SECRET`, one key per variable."""
    return [{"name": n, "valueFrom": {"secretKeyRef": {"name": KEYS_SECRET, "key": n}}}
            for n in names]


def kubernetes_args(argv: Sequence[Arg]) -> list[str]:
    """``argv`` for a container: ``$(`` escaped in literals, references as ``$(NAME)``."""
    return [f"$({a.name})" if isinstance(a, EnvRef) else a.replace("$(", "$$(") for a in argv]


def scrape_annotations(port: int, path: str) -> dict[str, str]:
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
            "prometheus.io/path": path}


def engine_objects(blueprint: Blueprint, engine: EngineBlueprint) -> list[Obj]:
    """A pool's Deployment, headless Service and PodDisruptionBudget."""
    ports = {METRICS_PORT_NAME["engine"]: engine.port, **engine.side_ports}
    pod_meta = {"labels": {POOL_LABEL: engine.name.removeprefix("engine-")},
                "annotations": {**scrape_annotations(engine.port, engine.metrics_path),
                                POOL_ANNOTATION: engine.pool.name}}
    rolling = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    return [
        deployment(blueprint, engine.name, "engine", engine.replicas, engine_pod(engine, ports),
                   pod_meta, rolling),
        service(blueprint, engine.name, "engine", ports, headless=True),
        disruption_budget(blueprint, engine.name, "engine"),
    ]


def engine_pod(engine: EngineBlueprint, ports: Mapping[str, int]) -> Obj:
    """The PodSpec of one engine: its command, GPUs, probes, cache and shared memory."""
    argv = kubernetes_args(engine.argv)
    hf_token = {"name": HF_TOKEN, "valueFrom": {"secretKeyRef": {
        "name": HF_SECRET, "key": HF_TOKEN, "optional": True}}}
    port = METRICS_PORT_NAME["engine"]
    container: Obj = {
        "name": "engine", "image": engine.image, "command": argv[:3], "args": argv[3:],
        "env": [*secret_env(engine.secrets()), hf_token], "ports": container_ports(ports),
        "startupProbe": http_probe(engine.health_path, port, 10, ENGINE_STARTUP_S // 10),
        "readinessProbe": http_probe(engine.health_path, port, 10, 3),
        "livenessProbe": http_probe(engine.health_path, port, 30, 5),
        "volumeMounts": [{"name": "hf-cache", "mountPath": HF_CACHE},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }  # fmt: skip
    if engine.gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": engine.gpus}}
    return {"containers": [container],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                             "effect": "NoSchedule"}],
            "volumes": [{"name": "hf-cache", "emptyDir": {}},
                        {"name": "dshm", "emptyDir": {"medium": "Memory"}}]}


def ridge_objects(blueprint: Blueprint, fleet_yaml: str) -> list[Obj]:
    """The fleet ConfigMap, ridge's Deployment, Service and PodDisruptionBudget."""
    checksum = hashlib.sha256(fleet_yaml.encode()).hexdigest()
    pod_meta = {"annotations": {**scrape_annotations(RIDGE_ADMIN_PORT, "/metrics"),
                                "ridge/fleet-sha256": checksum}}
    rolling = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    return [
        config_map(blueprint, "ridge-fleet", "gateway", {FLEET_FILE: fleet_yaml}),
        deployment(blueprint, "ridge", "gateway", blueprint.options.ridge_replicas,
                   ridge_pod(blueprint), pod_meta, rolling),
        service(blueprint, "ridge", "gateway", {"http": RIDGE_PORT}),
        service(blueprint, RIDGE_METRICS, "gateway",
                {METRICS_PORT_NAME["gateway"]: RIDGE_ADMIN_PORT}, headless=True, pods="ridge"),
        disruption_budget(blueprint, "ridge", "gateway"),
    ]


def ridge_pod(blueprint: Blueprint) -> Obj:
    """The gateway's PodSpec (non-root; drains on SIGTERM within the grace period)."""
    env = [{"name": "RIDGE_REDIS_URL", "value": f"redis://redis:{REDIS_PORT}/0"},
           {"name": "RIDGE_ADMIN_PORT", "value": str(RIDGE_ADMIN_PORT)},
           {"name": "RIDGE_CONFIG", "value": f"{FLEET_DIR}/{FLEET_FILE}"},
           *secret_env(blueprint.secrets())]
    container: Obj = {
        "name": "ridge", "image": blueprint.options.image("ridge"),
        "args": ["serve", "--config", f"{FLEET_DIR}/{FLEET_FILE}", "--host", "0.0.0.0"],
        "env": env,
        "ports": container_ports({"http": RIDGE_PORT,
                                  METRICS_PORT_NAME["gateway"]: RIDGE_ADMIN_PORT}),
        "readinessProbe": http_probe("/ready", "http", 5, 2),
        "livenessProbe": http_probe("/health", "http", 10, 3),
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"},
                      "limits": {"memory": "1Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "fleet", "mountPath": FLEET_DIR, "readOnly": True}],
    }  # fmt: skip
    return {"containers": [container], "terminationGracePeriodSeconds": 45,
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "volumes": [{"name": "fleet", "configMap": {"name": "ridge-fleet"}}]}


def redis(blueprint: Blueprint) -> list[Obj]:
    """Redis: the router state the gateway replicas share (soft state: no volume)."""
    container = {"name": "redis", "image": blueprint.options.image("redis"),
                 "ports": container_ports({"redis": REDIS_PORT}),
                 "readinessProbe": {"exec": {"command": ["redis-cli", "ping"]},
                                    "periodSeconds": 5}}
    return [deployment(blueprint, "redis", "state", 1, {"containers": [container]}),
            service(blueprint, "redis", "state", {"redis": REDIS_PORT})]


def prometheus_objects(blueprint: Blueprint, assets: Assets) -> list[Obj]:
    """Prometheus with the project's rules, scraping the pods behind the headless Services."""
    hosts = {e.pool.name: service_host(blueprint, e.name) for e in blueprint.engines}
    config = kubernetes_config(assets, blueprint, service_host(blueprint, RIDGE_METRICS), hosts)
    rules = {p.name: p.read_text() for p in assets.rule_files()}
    return [
        config_map(blueprint, "prometheus", "monitoring",
                   {"prometheus.yml": to_yaml(config), **rules}),
        deployment(blueprint, "prometheus", "monitoring", 1,
                   prometheus_pod(blueprint, sorted(rules))),
        service(blueprint, "prometheus", "monitoring", {"web": PROMETHEUS_PORT}),
    ]


def prometheus_pod(blueprint: Blueprint, rules: Sequence[str]) -> Obj:
    items = [{"key": "prometheus.yml", "path": "prometheus.yml"},
             *({"key": r, "path": f"rules/{r}"} for r in rules)]
    container = {
        "name": "prometheus", "image": blueprint.options.image("prometheus"),
        "args": ["--config.file=/etc/prometheus/prometheus.yml",
                 "--storage.tsdb.path=/prometheus"],
        "ports": container_ports({"web": PROMETHEUS_PORT}),
        "readinessProbe": http_probe("/-/ready", "web", 10, 3),
        "volumeMounts": [{"name": "config", "mountPath": "/etc/prometheus"},
                         {"name": "data", "mountPath": "/prometheus"}],
    }  # fmt: skip
    return {"containers": [container],
            "volumes": [{"name": "config", "configMap": {"name": "prometheus", "items": items}},
                        {"name": "data", "emptyDir": {}}]}


def grafana_objects(blueprint: Blueprint, assets: Assets) -> list[Obj]:
    """Grafana with the project's provisioning and dashboards as ConfigMaps; its admin password
    from the Secret :data:`GRAFANA_SECRET` (required: the pod does not start without it)."""
    provisioning = assets.provisioning()
    maps = {f"grafana-{kind}": {"ridge.yml": path.read_text()}
            for kind, path in provisioning.items()}
    maps["grafana-ridge-dashboards"] = {p.name: p.read_text() for p in assets.dashboards()}
    return [
        *(config_map(blueprint, name, "dashboards", data) for name, data in maps.items()),
        deployment(blueprint, "grafana", "dashboards", 1,
                   grafana_pod(blueprint, sorted(provisioning))),
        service(blueprint, "grafana", "dashboards", {"web": GRAFANA_PORT}),
    ]


def grafana_pod(blueprint: Blueprint, kinds: Sequence[str]) -> Obj:
    mounts = [{"name": f"grafana-{k}", "mountPath": f"/etc/grafana/provisioning/{k}"}
              for k in kinds]
    mounts.append({"name": "grafana-ridge-dashboards", "mountPath": DASHBOARDS_MOUNT})
    container = {
        "name": "grafana", "image": blueprint.options.image("grafana"),
        "env": [{"name": "RIDGE_PROMETHEUS_URL",
                 "value": f"http://prometheus:{PROMETHEUS_PORT}"},
                {"name": "RIDGE_DASHBOARDS", "value": DASHBOARDS_MOUNT},
                {"name": "GF_SECURITY_ADMIN_PASSWORD", "valueFrom": {"secretKeyRef": {
                    "name": GRAFANA_SECRET, "key": "admin-password"}}}],
        "ports": container_ports({"web": GRAFANA_PORT}),
        "readinessProbe": http_probe("/api/health", "web", 10, 3),
        "volumeMounts": mounts,
    }  # fmt: skip
    volumes = [{"name": m["name"], "configMap": {"name": m["name"]}} for m in mounts]
    return {"containers": [container], "volumes": volumes}
