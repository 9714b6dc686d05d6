"""gateway.render.monitoring: the rendered scrape jobs are the ones the project's rules and
dashboards query, and the rest of the project's Prometheus configuration is kept."""

from __future__ import annotations

import re

import yaml

from gateway.render.blueprint import make_blueprint
from gateway.render.compose import engine_services
from gateway.render.monitoring import (
    ENGINES_JOB,
    RIDGE_JOB,
    base_config,
    compose_config,
    kubernetes_config,
)
from tests.unit.gateway.render.fleets import ROOT, assets, rich_fleet


def test_the_job_names_are_the_projects() -> None:
    project = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    assert [j["job_name"] for j in project["scrape_configs"]] == [RIDGE_JOB, ENGINES_JOB]
    queried = set(re.findall(r'job="([^"]+)"', "".join(
        p.read_text() for p in [*assets().rule_files(), *assets().dashboards()])))
    assert queried <= {RIDGE_JOB, ENGINES_JOB} and queried


def test_global_settings_and_rules_are_kept() -> None:
    blueprint = make_blueprint(rich_fleet())
    base = base_config(assets())
    assert "scrape_configs" not in base and base["rule_files"]
    hosts = {e.pool.name: f"{e.name}.ns" for e in blueprint.engines}
    for config in (compose_config(assets(), blueprint, engine_services(blueprint), "ridge"),
                   kubernetes_config(assets(), blueprint, "ridge-metrics.ns", hosts)):
        assert {k: v for k, v in config.items() if k != "scrape_configs"} == base
        assert [j["job_name"] for j in config["scrape_configs"]] == [RIDGE_JOB, ENGINES_JOB]
