"""gateway.render.blueprint: names, replicas, command lines and GPUs per pool; the rendered
fleet."""

from __future__ import annotations

import re
from typing import Any

import pytest

from backends.launch.args import EnvRef
from backends.launch.sglang import sglang_args
from backends.launch.vllm import DEPLOY_SETTINGS, vllm_args
from config.fleet import parse_fleet
from gateway.render.blueprint import (
    DEFAULT_IMAGES,
    RenderError,
    RenderOptions,
    dns_label,
    make_blueprint,
    rendered_fleet,
    ridge_image,
)
from tests.unit.gateway.render.fleets import rich_fleet, rich_raw

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


@pytest.mark.parametrize("name", ["General_Pool.v2", "x" * 64, "__", "a.b-c_d", "9lives"])
def test_dns_labels(name: str) -> None:
    assert DNS_LABEL.match(dns_label("engine", name))


def test_long_names_stay_distinct() -> None:
    assert dns_label("engine", "x" * 64) != dns_label("engine", "x" * 63 + "y")


def test_engines_per_pool() -> None:
    blueprint = make_blueprint(rich_fleet())
    by_pool = {e.pool.name: e for e in blueprint.engines}
    general = by_pool["General_Pool.v2"]
    assert general.name == "engine-general-pool-v2" and general.replicas == 2
    assert general.image == DEFAULT_IMAGES["vllm"] and general.gpus == 2
    assert general.port == 8000 and general.health_path == "/health"
    assert general.argv[:3] == ("python3", "-m", "vllm.entrypoints.openai.api_server")
    assert EnvRef("VLLM_KEY") in general.argv and general.secrets() == ["VLLM_KEY"]
    prefill = by_pool["sgl-prefill"]
    assert prefill.gpus == 4 and prefill.side_ports == {"bootstrap": 8998}
    assert by_pool["vllm-decode"].side_ports == {"nixl": 5600}
    assert blueprint.secrets() == ["SGL_KEY", "VLLM_KEY"]


def test_the_command_is_the_launch_modules_own() -> None:
    blueprint = make_blueprint(rich_fleet())
    general, prefill = blueprint.engines[0], blueprint.engines[1]
    assert list(general.argv[3:]) == vllm_args(general.pool, 8000, "/models/llama",
                                               DEPLOY_SETTINGS)
    assert list(prefill.argv[3:])[:2] == ["--host", "0.0.0.0"]
    assert "org/llama" in prefill.argv  # no checkpoint: the first model name
    assert sglang_args(prefill.pool, 30000, "org/llama")[2:] == list(prefill.argv[5:])


def test_options_and_images() -> None:
    options = RenderOptions(images={"vllm": "mirror/vllm:1"})
    blueprint = make_blueprint(rich_fleet(), options)
    assert blueprint.engines[0].image == "mirror/vllm:1"
    assert options.image("ridge") == ridge_image() and ridge_image().startswith("ridge:")
    with pytest.raises(RenderError, match="at least one replica"):
        make_blueprint(rich_fleet(), RenderOptions(ridge_replicas=0))


def test_pools_that_would_share_a_name_are_refused() -> None:
    raw = rich_raw()
    twin = dict(raw["pools"][0], name="general-pool-v2", endpoints=["http://z:8000"])
    raw["pools"].append(twin)
    with pytest.raises(RenderError, match="would share"):
        make_blueprint(parse_fleet(raw))


def test_an_unrenderable_pool_is_a_render_error() -> None:
    raw = rich_raw()
    raw["pools"][0]["engine_args"] = ["--enable-prefix-caching"]
    with pytest.raises(RenderError, match="engine_args may not set"):
        make_blueprint(parse_fleet(raw))


def test_the_rendered_fleet_keeps_everything_but_endpoints_and_tokenizers() -> None:
    blueprint = make_blueprint(rich_fleet())
    urls = {p.name: [f"http://{p.name.lower().replace('_', '-')}:1"] for p in blueprint.fleet.pools}
    raw, warnings = rendered_fleet(blueprint, urls)
    again = parse_fleet(raw)
    assert [p.endpoint_urls() for p in again.pools] == list(urls.values())
    for before, after in zip(blueprint.fleet.pools, again.pools, strict=True):
        assert before.model_copy(update={"endpoints": after.endpoints}) == after
    assert again.slos == blueprint.fleet.slos
    assert again.routing.features.tokenizers == {}
    assert len(warnings) == 1 and "tokenizers" in warnings[0]
    assert "vk-test" not in str(raw) and raw["pools"][0]["api_key_env"] == "VLLM_KEY"


def kv_events_raw() -> dict[str, Any]:
    """The rich fleet with KV event streams on its first pool, whose engines the fleet file
    lists on explicit addresses."""
    raw = rich_raw()
    raw["pools"][0]["kv_events"] = {
        "port": 5557, "replay_port": 5558, "topic": "kv",
        "addresses": ["tcp://a:6001", "tcp://b:6001"]}  # fmt: skip
    return raw


def test_kv_event_ports_are_side_ports_and_addresses_stay_behind() -> None:
    blueprint = make_blueprint(parse_fleet(kv_events_raw()))
    general = blueprint.engines[0]
    assert general.side_ports == {"kv-events": 5557, "kv-replay": 5558}
    assert blueprint.engines[4].side_ports == {"nixl": 5600}  # without kv_events: as before
    urls = {p.name: [f"http://e{n}-{i}:1" for i in range(2)]
            for n, p in enumerate(blueprint.fleet.pools)}
    raw, warnings = rendered_fleet(blueprint, urls)
    # each rendered engine has its own host: the streams follow the endpoints
    assert raw["pools"][0]["kv_events"] == {"port": 5557, "replay_port": 5558, "topic": "kv"}
    sources = parse_fleet(raw).pools[0].kv_event_sources()
    assert sources["http://e0-1:1"].publish == "tcp://e0-1:5557"
    assert any("kv_events.addresses left out" in w for w in warnings)
