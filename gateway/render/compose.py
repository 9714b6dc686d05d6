"""The compose target: one ``compose.yaml`` and the files it mounts, for one GPU host.

Services:
- ``redis``: the router state every ridge replica shares (``RIDGE_REDIS_URL``);
- ``ridge``: the gateway image (built from ``deploy/docker/Dockerfile`` when missing), as many
  replicas as asked, published on consecutive host ports from 8080; ``/metrics`` on the admin
  port for Prometheus; the rendered fleet file mounted at ``/etc/ridge/fleet.yaml``;
- ``engine-POOL-I``: one service per endpoint of each pool (stable names, which the rendered
  fleet file lists), started with the pool's rendered command line, its GPUs reserved by device
  id (assigned in order over the engines, so no two engines share a GPU: with a bare ``count``
  Docker would hand every container the first GPUs), a health check on the engine's health
  path with a long start period (a checkpoint download), and a shared Hugging Face cache;
- ``prometheus`` with the project's rules and scrape targets (:mod:`gateway.render.monitoring`);
  ``grafana`` with the project's provisioning and dashboards, its admin password
  :data:`GRAFANA_PASSWORD` (no default login).

Only ridge's port is published on every host interface; Prometheus and Grafana are published on
the host's loopback only (an SSH tunnel or a reverse proxy of your own reaches them), and Redis
and the engines not at all. Secrets (the engines' API keys, Grafana's admin password) are
compose variables (``${NAME:?...}``: compose refuses to start without them), taken from the
environment or a ``.env`` file beside ``compose.yaml`` (``.env.example`` lists them); no
rendered file holds one. A literal ``$`` in an argument is written ``$$``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from backends.launch.args import Arg, EnvRef
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
from gateway.render.monitoring import compose_config

COMPOSE_FILE = "compose.yaml"
ENV_EXAMPLE = ".env.example"
PROJECT = "ridge"
RIDGE, REDIS, PROMETHEUS, GRAFANA = "ridge", "redis", "prometheus", "grafana"
DASHBOARDS_MOUNT = "/var/lib/grafana/dashboards/ridge"
GRAFANA_PASSWORD = "GRAFANA_ADMIN_PASSWORD"
"""The compose variable Grafana's admin password is read from (required)."""
LOOPBACK = "127.0.0.1"
ENGINE_START_PERIOD = "900s"  # a first start downloads the checkpoint


def engine_services(blueprint: Blueprint) -> dict[str, list[str]]:
    """Pool name → the names of its engine services, one per endpoint."""
    return {e.pool.name: [f"{e.name}-{i}" for i in range(e.replicas)] for e in blueprint.engines}


def render_compose(blueprint: Blueprint, assets: Assets, build_context: str | None) -> Rendered:
    """The compose deployment of ``blueprint``; ``build_context`` is the checkout, relative to the
    output folder, from which compose builds the ridge image (None: only pull ``image``)."""
    services = engine_services(blueprint)
    endpoints = {e.pool.name: [f"http://{s}:{e.port}" for s in services[e.pool.name]]
                 for e in blueprint.engines}
    fleet, warnings = rendered_fleet(blueprint, endpoints)
    files = {
        COMPOSE_FILE: to_yaml(compose_project(blueprint, services, build_context)),
        FLEET_FILE: to_yaml(fleet),
        ENV_EXAMPLE: env_example(blueprint.secrets()),
        "prometheus/prometheus.yml": to_yaml(compose_config(assets, blueprint, services, RIDGE)),
        **{f"prometheus/rules/{p.name}": p.read_text() for p in assets.rule_files()},
        **{f"grafana/provisioning/{kind}/ridge.yml": p.read_text()
           for kind, p in assets.provisioning().items()},
        **{f"grafana/dashboards/{p.name}": p.read_text() for p in assets.dashboards()},
    }
    return Rendered(files, warnings, [*blueprint.secrets(), GRAFANA_PASSWORD])


def compose_project(blueprint: Blueprint, services: dict[str, list[str]],
                    build_context: str | None) -> dict[str, Any]:
    """The ``compose.yaml`` document."""
    engines: dict[str, Any] = {}
    next_gpu = 0
    for engine in blueprint.engines:
        for name in services[engine.pool.name]:
            gpus = [str(g) for g in range(next_gpu, next_gpu + engine.gpus)]
            next_gpu += engine.gpus
            engines[name] = engine_service(engine, gpus)
    return {"name": PROJECT, "services": {
        REDIS: redis_service(blueprint), RIDGE: ridge_service(blueprint, build_context), **engines,
        PROMETHEUS: prometheus_service(blueprint), GRAFANA: grafana_service(blueprint),
    }, "volumes": {"hf-cache": {}, "prometheus-data": {}, "grafana-data": {}}}  # fmt: skip


def ridge_service(blueprint: Blueprint, build_context: str | None) -> dict[str, Any]:
    """The gateway: replicas sharing Redis, each its own host port."""
    replicas = blueprint.options.ridge_replicas
    ports = f"{RIDGE_PORT}-{RIDGE_PORT + replicas - 1}" if replicas > 1 else str(RIDGE_PORT)
    service: dict[str, Any] = {
        "image": blueprint.options.image("ridge"),
        "command": ["serve", "--config", f"{FLEET_DIR}/{FLEET_FILE}", "--host", "0.0.0.0"],
        "environment": {"RIDGE_REDIS_URL": f"redis://{REDIS}:{REDIS_PORT}/0",
                        "RIDGE_ADMIN_PORT": str(RIDGE_ADMIN_PORT),
                        **{n: _required(n) for n in blueprint.secrets()}},
        "volumes": [f"./{FLEET_FILE}:{FLEET_DIR}/{FLEET_FILE}:ro"],
        "ports": [f"{ports}:{RIDGE_PORT}"],
        "depends_on": {REDIS: {"condition": "service_healthy"}},
        "deploy": {"replicas": replicas},
        "restart": "unless-stopped",
    }
    if build_context is not None:
        service["build"] = {"context": build_context, "dockerfile": "deploy/docker/Dockerfile"}
    return service


def engine_service(engine: EngineBlueprint, gpu_ids: Sequence[str]) -> dict[str, Any]:
    """One engine of a pool, on the GPUs ``gpu_ids``."""
    argv = compose_args(engine.argv)
    env = {HF_TOKEN: f"${{{HF_TOKEN}:-}}", **{n: _required(n) for n in engine.secrets()}}
    service: dict[str, Any] = {
        "image": engine.image, "entrypoint": argv[:3], "command": argv[3:],
        "environment": env, "volumes": [f"hf-cache:{HF_CACHE}"], "ipc": "host",
        "healthcheck": {"test": _http_check(engine.port, engine.health_path),
                        "interval": "15s", "timeout": "10s", "retries": 3,
                        "start_period": ENGINE_START_PERIOD},
        "restart": "unless-stopped",
        "labels": {"ridge.pool": engine.pool.name},
    }  # fmt: skip
    if gpu_ids:
        service["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "device_ids": list(gpu_ids), "capabilities": ["gpu"]}]}}}
    return service


def redis_service(blueprint: Blueprint) -> dict[str, Any]:
    return {"image": blueprint.options.image("redis"), "restart": "unless-stopped",
            "healthcheck": {"test": ["CMD", "redis-cli", "ping"], "interval": "5s",
                            "timeout": "3s", "retries": 5}}


def prometheus_service(blueprint: Blueprint) -> dict[str, Any]:
    return {
        "image": blueprint.options.image("prometheus"),
        "command": ["--config.file=/etc/prometheus/prometheus.yml",
                    "--storage.tsdb.path=/prometheus"],
        "volumes": ["./prometheus:/etc/prometheus:ro", "prometheus-data:/prometheus"],
        "ports": [loopback_port(PROMETHEUS_PORT)],
        "restart": "unless-stopped",
    }


def grafana_service(blueprint: Blueprint) -> dict[str, Any]:
    return {
        "image": blueprint.options.image("grafana"),
        "environment": {"RIDGE_PROMETHEUS_URL": f"http://{PROMETHEUS}:{PROMETHEUS_PORT}",
                        "RIDGE_DASHBOARDS": DASHBOARDS_MOUNT,
                        "GF_SECURITY_ADMIN_PASSWORD": _required(GRAFANA_PASSWORD)},
        "volumes": ["./grafana/provisioning:/etc/grafana/provisioning:ro",
                    f"./grafana/dashboards:{DASHBOARDS_MOUNT}:ro",
                    "grafana-data:/var/lib/grafana"],
        "ports": [loopback_port(GRAFANA_PORT)],
        "depends_on": [PROMETHEUS],
        "restart": "unless-stopped",
    }


def loopback_port(port: int) -> str:
    """``port`` published on the host's loopback only, never on its other interfaces."""
    return f"{LOOPBACK}:{port}:{port}"


def compose_args(argv: Sequence[Arg]) -> list[str]:
    """``argv`` for compose: ``$`` escaped in literals, references as required variables."""
    return [_required(a.name) if isinstance(a, EnvRef) else a.replace("$", "$$") for a in argv]


def env_example(secrets: Sequence[str]) -> str:
    """The ``.env`` template: every variable the deployment reads, without values."""
    lines = ["# Copy to .env beside compose.yaml and fill in (never commit the filled file).",
             "# Engine API keys: the engines start with --api-key and ridge sends it upstream."]
    lines += [f"{name}=" for name in secrets]
    lines += ["# Grafana's admin password (user admin); Grafana is on the host's loopback only.",
              f"{GRAFANA_PASSWORD}="]
    lines += ["# Optional: a Hugging Face token, for gated checkpoints.", f"{HF_TOKEN}="]
    return "\n".join(lines) + "\n"


def _required(name: str) -> str:
    return f"${{{name}:?{name} is not set (see {ENV_EXAMPLE})}}"


def _http_check(port: int, path: str) -> list[str]:
    url = json.dumps(f"http://127.0.0.1:{port}{path}")
    return ["CMD", "python3", "-c", f"import urllib.request; urllib.request.urlopen({url}, "
            "timeout=5)"]
