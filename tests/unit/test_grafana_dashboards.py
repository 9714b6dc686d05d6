"""The Grafana dashboards and provisioning files, checked structurally (no Grafana needed).

Every panel must name the Prometheus data source variable and carry PromQL targets; every
template variable a query uses must be defined; panels must not overlap; each dashboard must
show what it is for. ``tests/integration/test_prometheus.py`` runs every query for real.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

GRAFANA = Path(__file__).resolve().parents[2] / "grafana"
DASHBOARDS = {p.stem: json.loads(p.read_text()) for p in sorted(GRAFANA.glob("dashboards/*.json"))}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
BUILTINS = {"__rate_interval", "__interval", "__range"}

# what each dashboard is for: metric names its queries must use
PURPOSE = {
    "ridge-overview": ["ridge_goodput_requests_total", "ridge_requests_total",
                       "ridge_time_to_first_token_seconds_bucket",
                       "ridge_time_to_first_byte_seconds_bucket",
                       "ridge_time_per_output_token_seconds_bucket", "ridge_slo_objective_seconds",
                       "ridge_slo_violations_total"],
    "ridge-routing": ["ridge_route_decisions_total", "ridge_prefix_share_ratio",
                      "ridge_engine_prefix_cache_hits_total", "ridge_tokens_in_flight",
                      "ridge_workload_prompt_tokens", "ridge_workload_output_tokens"],
    "ridge-efficiency": ["ridge_pool_mfu_ratio", "ridge_pool_mbu_ratio", "ridge_mfu_ratio",
                         "ridge_mbu_ratio", "ridge_estimated_flops_total",
                         "ridge_pool_binding_wall", "ridge_prefix_lost_tokens_total",
                         "ridge_prefix_predicted_tokens_total", "ridge_pool_kv_demand_ratio"],
    "ridge-backends": ["ridge_endpoint_up", "ridge_engine_requests_waiting",
                       "ridge_engine_kv_cache_usage_ratio", "ridge_upstream_retries_total",
                       "ridge_lever_mismatch"],
}


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        out.extend(panel.get("panels", []))
        if panel.get("type") != "row":
            out.append(panel)
    return out


def test_four_dashboards_with_distinct_uids() -> None:
    assert set(DASHBOARDS) == set(PURPOSE)
    uids = [d["uid"] for d in DASHBOARDS.values()]
    assert sorted(uids) == sorted(PURPOSE)


@pytest.mark.parametrize("name", sorted(PURPOSE))
def test_every_panel_has_the_data_source_and_promql_targets(name: str) -> None:
    dashboard = DASHBOARDS[name]
    panels = _panels(dashboard)
    assert len(panels) >= 6
    for panel in panels:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["title"] and panel["type"] in ("timeseries", "stat", "gauge", "table")
        targets = panel["targets"]
        assert targets, panel["title"]
        assert len({t["refId"] for t in targets}) == len(targets), panel["title"]
        for target in targets:
            assert isinstance(target["expr"], str) and target["expr"].strip(), panel["title"]
            assert target.get("datasource", DATASOURCE) == DATASOURCE


@pytest.mark.parametrize("name", sorted(PURPOSE))
def test_template_variables_used_are_defined(name: str) -> None:
    dashboard = DASHBOARDS[name]
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    assert "datasource" in defined
    for panel in _panels(dashboard):
        for target in panel["targets"]:
            used = set(re.findall(r"\$\{?(\w+)", target["expr"]))
            assert used <= defined | BUILTINS, (panel["title"], used - defined - BUILTINS)


@pytest.mark.parametrize("name", sorted(PURPOSE))
def test_panels_do_not_overlap(name: str) -> None:
    cells: set[tuple[int, int]] = set()
    for panel in _panels(DASHBOARDS[name]):
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, panel["title"]
        cells |= mine


@pytest.mark.parametrize(("name", "metrics"), sorted(PURPOSE.items()))
def test_each_dashboard_shows_what_it_is_for(name: str, metrics: list[str]) -> None:
    exprs = " ".join(t["expr"] for p in _panels(DASHBOARDS[name]) for t in p["targets"])
    missing = [m for m in metrics if not re.search(rf"\b{m}\b", exprs)]
    assert missing == []


def test_provisioning_files() -> None:
    sources = yaml.safe_load((GRAFANA / "provisioning/datasources/ridge.yml").read_text())
    (source,) = sources["datasources"]
    assert (source["type"], source["uid"], source["isDefault"]) == (
        "prometheus", "ridge-prometheus", True)
    providers = yaml.safe_load((GRAFANA / "provisioning/dashboards/ridge.yml").read_text())
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]
