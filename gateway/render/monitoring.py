"""Prometheus scrape configurations of a rendered deployment.

Both start from the project's own ``deploy/prometheus/prometheus.yml`` (its global settings and
its ``rule_files``, whose rules ship beside it unchanged) and replace its scrape targets with
the deployment's real services, under the job names the rules and dashboards use
(:data:`RIDGE_JOB`, :data:`ENGINES_JOB`); every engine series carries its ``pool`` (the fleet's
pool name).

- compose: ridge's replicas are found through Docker's DNS (``dns_sd_configs``: the service
  name resolves to every replica), each engine container is a static target;
- Kubernetes: every ready pod behind a headless Service is an A record of the Service's DNS
  name, so ``dns_sd_configs`` finds each engine and each gateway replica without any access
  to the Kubernetes API (no RBAC); the pool (and metrics path) is set by the DNS name a target
  was found under. The pods also carry the conventional ``prometheus.io/*`` annotations
  (:data:`POOL_ANNOTATION` for the pool), for a cluster Prometheus that discovers pods by them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from gateway.render.assets import Assets
from gateway.render.blueprint import RIDGE_ADMIN_PORT, Blueprint

RIDGE_JOB = "ridge"
ENGINES_JOB = "ridge-engines"
POOL_ANNOTATION = "ridge-pool"
METRICS_PORT_NAME = {"gateway": "metrics", "engine": "http"}
"""Per component, the name of the container port that serves ``/metrics``."""


def base_config(assets: Assets) -> dict[str, Any]:
    """The project's Prometheus configuration without its scrape targets."""
    config: dict[str, Any] = yaml.safe_load(assets.prometheus_config.read_text())
    config.pop("scrape_configs", None)
    return config


def compose_config(assets: Assets, blueprint: Blueprint, services: Mapping[str, Sequence[str]],
                   ridge_service: str) -> dict[str, Any]:
    """Prometheus for compose; ``services``: pool name → its engine services."""
    engines = [
        {"targets": [f"{s}:{e.port}" for s in services[e.pool.name]],
         "labels": {"pool": e.pool.name, "__metrics_path__": e.metrics_path}}
        for e in blueprint.engines
    ]
    ridge = {"names": [ridge_service], "type": "A", "port": RIDGE_ADMIN_PORT}
    return {**base_config(assets), "scrape_configs": [
        {"job_name": RIDGE_JOB, "dns_sd_configs": [ridge]},
        {"job_name": ENGINES_JOB, "static_configs": engines},
    ]}  # fmt: skip


def kubernetes_config(assets: Assets, blueprint: Blueprint, ridge_host: str,
                      engine_hosts: Mapping[str, str]) -> dict[str, Any]:
    """Prometheus for Kubernetes: every pod behind the headless Services, found through the
    cluster DNS; ``engine_hosts``: pool name → its Service's DNS name."""
    engines = [{"names": [engine_hosts[e.pool.name]], "type": "A", "port": e.port}
               for e in blueprint.engines]
    relabel = [rule for e in blueprint.engines for rule in (
        _by_host(engine_hosts[e.pool.name], "pool", e.pool.name),
        _by_host(engine_hosts[e.pool.name], "__metrics_path__", e.metrics_path))]
    ridge = {"names": [ridge_host], "type": "A", "port": RIDGE_ADMIN_PORT}
    return {**base_config(assets), "scrape_configs": [
        {"job_name": RIDGE_JOB, "dns_sd_configs": [ridge]},
        {"job_name": ENGINES_JOB, "dns_sd_configs": engines, "relabel_configs": relabel},
    ]}  # fmt: skip


def _by_host(host: str, label: str, value: str) -> dict[str, Any]:
    """Set ``label`` to ``value`` on targets found under the DNS name ``host``."""
    return {"source_labels": ["__meta_dns_name"], "regex": re.escape(host),
            "target_label": label, "replacement": value}
