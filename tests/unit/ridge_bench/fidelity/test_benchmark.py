"""``ridge bench fidelity``: which pools it compares, its plan, its verdict and run facts."""

from __future__ import annotations

import pytest

from config.fleet import FleetConfigError, load_fleet, parse_fleet
from ridge_bench.fidelity.benchmark import (
    FLEET,
    meta,
    on_free_ports,
    setup_for,
    spec_and_plain,
    verdict,
)
from tests.unit.ridge_bench.fidelity.test_report import side


def test_the_real_demo_fleet_has_a_spec_and_a_plain_pool() -> None:
    fleet = load_fleet(str(FLEET))
    spec, plain = spec_and_plain(fleet)
    assert (spec.name, plain.name) == ("spec", "plain")
    assert setup_for(fleet, 2).spec_k == 4
    moved = on_free_ports(fleet)
    assert [p.endpoint_urls() for p in moved.pools] != [p.endpoint_urls() for p in fleet.pools]


def test_a_fleet_without_an_ngram_pool_is_refused() -> None:
    pool = {"engine": "vllm", "models": ["m"], "endpoints": ["http://127.0.0.1:1"]}
    fleet = parse_fleet({"pools": [{"name": "a", **pool}]})
    with pytest.raises(FleetConfigError, match="n-gram speculative pool"):
        spec_and_plain(fleet)


def test_the_verdict_names_what_fails() -> None:
    assert verdict(side(), side()) == []
    failures = verdict(side(), side(copy_spec=30.0, tokens=49))
    assert failures == ["n-gram speed-up, copy: spec ÷ plain decode rate: real 3.000, "
                        "simulated 1.500", "short: real [50, 50], simulated [49, 49]"]


def test_the_run_facts_name_the_fleet_relative_to_the_checkout() -> None:
    facts = meta(FLEET, setup_for(load_fleet(str(FLEET)), 3), "today", 12.3)
    assert facts["fleet"] == "gateway/demo/demo-real-fleet.yaml"
    assert (facts["repeats"], facts["run"]) == (3, "12 s")
