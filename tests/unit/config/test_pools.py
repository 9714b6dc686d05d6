"""The fleet file's pools: defaults, launch settings, endpoint resolution, LoRA adapters."""

from __future__ import annotations

from typing import Any

import pytest

from config.engines import Role
from config.fleet import FleetConfigError, parse_fleet
from tests.unit.config.fleets import pool


def test_defaults() -> None:
    fleet = parse_fleet({"pools": [pool()]})
    p = fleet.pools[0]
    assert p.role is Role.MIXED and not p.levers.prefix_caching and p.levers.speculative is None
    assert p.endpoint_urls() == ["http://h:1"]


def test_checkpoint_and_engine_args() -> None:
    (plain,) = parse_fleet({"pools": [pool()]}).pools
    assert plain.checkpoint is None and plain.engine_args == []
    extra = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    (p,) = parse_fleet({"pools": [pool(checkpoint="org/m", engine_args=extra)]}).pools
    assert p.checkpoint == "org/m" and p.engine_args == extra
    with pytest.raises(FleetConfigError, match="pools.0.engine_args"):
        parse_fleet({"pools": [pool(engine_args="--flag")]})


def test_resolve_is_off_unless_asked_and_dns_takes_http_endpoints_only() -> None:
    assert parse_fleet({"pools": [pool()]}).pools[0].resolve == "none"
    dns = parse_fleet({"pools": [pool(resolve="dns", endpoints=["http://engine:8000"])]})
    assert dns.pools[0].resolve == "dns"
    with pytest.raises(FleetConfigError) as info:
        parse_fleet({"pools": [pool(resolve="dns", endpoints=["https://engine:8443"])]},
                    source="fleet.yaml")
    assert "  pools.0: " in str(info.value)
    assert "resolve: dns connects to each address" in str(info.value)
    with pytest.raises(FleetConfigError, match="pools.0.resolve"):
        parse_fleet({"pools": [pool(resolve="srv")]})


def test_adapters_by_name_or_with_path_and_rank() -> None:
    p = parse_fleet({"pools": [pool(adapters=[
        "names-only", {"name": "sql-lora", "path": "/models/sql-lora", "rank": 12}])]}).pools[0]
    assert p.adapter_names() == ("names-only", "sql-lora")
    assert p.adapters[0].path is None and p.adapters[1].path == "/models/sql-lora"
    assert p.max_lora_rank() == 16  # 12 rounded up to a rank vLLM accepts
    assert parse_fleet({"pools": [pool()]}).pools[0].adapters == []
    assert parse_fleet({"pools": [pool(adapters=["a"])]}).pools[0].max_lora_rank() is None


@pytest.mark.parametrize(
    ("pools", "problem"),
    [
        ([pool(adapters=["a", {"name": "a"}])], "adapter listed twice"),
        ([pool(adapters=["m"])], "a name of its own"),
        ([pool(adapters=["other"]), pool(name="q", models=["other"], endpoints=["http://h:2"])],
         "also name a base model"),
        ([pool(adapters=[{"name": "a", "rank": 1024}])], "less than or equal to 512"),
        ([pool(adapters=[{"name": "bad name"}])], "pattern"),
    ],
)
def test_bad_adapters_name_the_problem(pools: list[dict[str, Any]], problem: str) -> None:
    with pytest.raises(FleetConfigError, match=problem) as caught:
        parse_fleet({"pools": pools})
    assert "adapters" in str(caught.value) or "pools.0" in str(caught.value)
