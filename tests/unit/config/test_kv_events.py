"""A pool's KV-cache event streams: where each engine publishes, and what the pool refuses."""

from __future__ import annotations

from typing import Any

import pytest

from config.engines import Engine
from config.fleet import FleetConfigError, parse_fleet
from config.kv_events import KV_EVENT_ENGINES, KvEventSource
from tests.unit.config.fleets import pool

CACHED = {"prefix_caching": True}


def test_kv_event_streams_on_each_endpoints_host() -> None:
    p = parse_fleet({"pools": [pool(
        endpoints=["http://a:8000", "http://[fd00::1]:8000"], levers=CACHED,
        kv_events={"port": 5557, "replay_port": 5558, "topic": "kv"})]}).pools[0]
    assert p.kv_event_sources() == {
        "http://a:8000": KvEventSource("tcp://a:5557", "tcp://a:5558", "kv"),
        "http://[fd00::1]:8000": KvEventSource("tcp://[fd00::1]:5557", "tcp://[fd00::1]:5558",
                                               "kv"),
    }
    assert p.kv_events is not None and p.kv_events.ports() == {"kv-events": 5557,
                                                               "kv-replay": 5558}
    plain = parse_fleet({"pools": [pool(levers=CACHED, kv_events={"port": 5557})]}).pools[0]
    assert plain.kv_event_sources() == {"http://h:1": KvEventSource("tcp://h:5557", None, "")}
    assert parse_fleet({"pools": [pool()]}).pools[0].kv_event_sources() == {}


def test_kv_event_addresses_name_engines_that_share_a_host() -> None:
    urls = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    listed = {"port": 5557, "addresses": ["tcp://127.0.0.1:5601", "tcp://127.0.0.1:5602"]}
    p = parse_fleet({"pools": [pool(endpoints=urls, levers=CACHED, kv_events={
        **listed, "replay_addresses": ["tcp://127.0.0.1:5701", "tcp://127.0.0.1:5702"]})]}
                    ).pools[0]
    assert p.kv_event_sources()[urls[1]] == KvEventSource("tcp://127.0.0.1:5602",
                                                          "tcp://127.0.0.1:5702", "")
    assert list(p.kv_event_sources([urls[1]])) == [urls[1]]
    with pytest.raises(ValueError, match="not one of the pool's endpoints"):
        p.kv_event_sources(["http://127.0.0.1:9999"])
    # replay_port with listed addresses: each address's host on that port
    p = parse_fleet({"pools": [pool(endpoints=["http://a:1", "http://b:1"], levers=CACHED,
                                    kv_events={"port": 5557, "replay_port": 5558,
                                               "addresses": ["tcp://x:1", "tcp://[::1]:2"]})]}
                    ).pools[0]
    assert [s.replay for s in p.kv_event_sources().values()] == ["tcp://x:5558",
                                                                  "tcp://[::1]:5558"]


def test_a_dns_pool_takes_kv_events_from_each_resolved_address() -> None:
    p = parse_fleet({"pools": [pool(resolve="dns", endpoints=["http://engine:8000"],
                                    levers=CACHED, kv_events={"port": 5557})]}).pools[0]
    resolved = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert p.kv_event_sources(resolved) == {
        u: KvEventSource(f"tcp://10.0.0.{i}:5557", None, "") for i, u in enumerate(resolved, 1)}


def test_an_sglang_pool_takes_kv_events_too() -> None:
    """Both engines' formats are decoded (backends.kv_events.wire.WIRE_FORMATS)."""
    assert {Engine.VLLM, Engine.SGLANG} == KV_EVENT_ENGINES
    p = parse_fleet({"pools": [pool(engine="sglang", levers=CACHED,
                                    kv_events={"port": 5557, "replay_port": 5558})]}).pools[0]
    assert p.kv_event_sources() == {"http://h:1": KvEventSource("tcp://h:5557", "tcp://h:5558",
                                                                "")}
    with pytest.raises(FleetConfigError, match="it needs levers.prefix_caching: true"):
        parse_fleet({"pools": [pool(engine="sglang", kv_events={"port": 5557})]})


@pytest.mark.parametrize(("over", "problem"), [
    ({"kv_events": {"port": 5557}}, "it needs levers.prefix_caching: true"),
    ({"levers": CACHED, "kv_events": {"port": 5557, "replay_port": 5557}},
     "replay_port must differ from port"),
    ({"levers": CACHED, "kv_events": {"port": 70000}},
     "pools.0.kv_events.port: Input should be less than or equal to 65535"),
    ({"levers": CACHED, "kv_events": {"port": 5557, "replay_addresses": ["tcp://h:1"]}},
     "replay_addresses go with addresses"),
    ({"levers": CACHED, "kv_events": {"port": 5557, "addresses": ["http://h:1"]}},
     "pools.0.kv_events.addresses.0: String should match pattern"),
    ({"levers": CACHED, "kv_events": {"port": 5557, "addresses": ["tcp://*:1"]}},
     "String should match pattern"),
    ({"levers": CACHED, "kv_events": {"port": 5557, "addresses": ["tcp://h:70000"]}},
     "addresses: tcp://h:70000 has no port from 1 to 65535"),
    ({"levers": CACHED, "kv_events": {"port": 5557, "addresses": ["tcp://a:1", "tcp://b:1"]}},
     "kv_events.addresses: one per endpoint (1), not 2"),
    ({"levers": CACHED, "endpoints": ["http://a:1", "http://b:1"],
      "kv_events": {"port": 5557, "addresses": ["tcp://a:1", "tcp://a:1"]}},
     "addresses: an address listed twice"),
    ({"levers": CACHED, "resolve": "dns", "kv_events": {"port": 5557, "addresses": ["tcp://a:1"]}},
     "a resolve: dns pool's engines are the addresses its names resolve to"),
    ({"levers": CACHED, "endpoints": ["http://a:1", "http://a:2"], "kv_events": {"port": 5557}},
     "endpoints share the host a"),
    ({"levers": CACHED, "endpoints": ["http://a:5557"], "kv_events": {"port": 5557}},
     "port 5557 is also an endpoint's HTTP port"),
    ({"levers": CACHED, "kv_events": {"port": 5557, "hwm": 10}},
     "pools.0.kv_events.hwm: Extra inputs are not permitted"),
])
def test_bad_kv_events_name_the_problem(over: dict[str, Any], problem: str) -> None:
    with pytest.raises(FleetConfigError) as exc:
        parse_fleet({"pools": [pool(**over)]})
    assert problem in str(exc.value)
