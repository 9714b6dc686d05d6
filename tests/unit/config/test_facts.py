"""Model and hardware facts: a catalogue name, full facts, or none."""

from __future__ import annotations

from typing import Any

import pytest

from config.fleet import FleetConfigError, parse_fleet
from routing.formulas import HardwareRates, ModelShape
from tests.unit.config.fleets import FACTS, pool


def test_facts_become_the_fleet_arithmetics_dataclasses() -> None:
    p = parse_fleet({"pools": [pool()]}).pools[0]
    assert p.model.to_shape() == ModelShape(1e9, 2, 8, 1, 8, 2.0)
    assert p.model.to_shape(kv_dtype_bytes=1).kv_bytes_per_token == 2 * 2 * 1 * 8 * 1
    assert p.hardware.to_rates() == HardwareRates(1e12, 1e11)


def test_facts_by_catalogue_name() -> None:
    (p,) = parse_fleet({"pools": [pool(model="Llama-3-8B", hardware="nvidia-h100-sxm")]}).pools
    assert p.model is not None and p.hardware is not None
    assert p.model.to_shape() == ModelShape(8.03e9, 32, 4096, 8, 128, 2.0)
    assert p.model.max_context == 8192
    assert p.hardware.name == "nvidia-h100-sxm"
    assert p.hardware.to_rates() == HardwareRates(989e12, 3.35e12)
    # named facts claim nothing about the engines' launch (the lever check reads this)
    assert p.model.name == "llama-3-8b" and p.model.model_fields_set == {"name"}


def test_facts_by_name_with_overrides() -> None:
    (p,) = parse_fleet({"pools": [pool(
        model={"name": "meta-llama/Llama-3.1-8B-Instruct", "max_context": 16384},
        hardware={"name": "L4", "kv_cache_bytes": 6e9})]}).pools
    assert p.model is not None and p.hardware is not None
    assert (p.model.layers, p.model.max_context) == (32, 16384)
    assert p.model.model_fields_set == {"name", "max_context"}
    assert (p.hardware.name, p.hardware.peak_flops, p.hardware.kv_cache_bytes) == (
        "nvidia-l4", 121e12, 6e9)


def test_full_facts_are_kept_as_written() -> None:
    hw = {"name": "H100-SXM", "peak_flops": 900e12, "mem_bandwidth": 3e12}
    model = {**FACTS, "name": "llama-3-8b"}  # every field given: a label, not a look-up
    (p,) = parse_fleet({"pools": [pool(model=model, hardware=hw)]}).pools
    assert p.hardware is not None and p.model is not None
    assert (p.hardware.name, p.hardware.peak_flops) == ("H100-SXM", 900e12)  # not the catalogue's
    assert (p.model.name, p.model.layers) == ("llama-3-8b", 2)
    assert "max_context" not in p.model.model_fields_set
    (own,) = parse_fleet({"pools": [pool(model={**FACTS, "name": "my-model"})]}).pools
    assert own.model is not None and own.model.name == "my-model"
    assert p.missing_facts() == ()


def test_named_facts_survive_a_dump_of_the_set_fields() -> None:
    # `ridge render` writes the deployed gateway's fleet file this way
    raw = {"pools": [pool(model={"name": "qwen2.5-7b", "max_context": 16384},
                          hardware="mi300x")]}
    fleet = parse_fleet(raw)
    dumped = fleet.model_dump(mode="json", exclude_unset=True)
    assert dumped["pools"][0]["model"] == {"name": "qwen2.5-7b", "max_context": 16384}
    again = parse_fleet(dumped)
    assert again == fleet
    assert again.pools[0].model is not None
    assert again.pools[0].model.model_fields_set == {"name", "max_context"}


def test_a_pool_without_facts_loads() -> None:
    bare = {k: v for k, v in pool().items() if k not in ("model", "hardware")}
    fleet = parse_fleet({"pools": [bare, pool(name="q", endpoints=["http://h:2"],
                                              hardware=None)]})
    p, q = fleet.pools
    assert (p.model, p.hardware, p.missing_facts()) == (None, None, ("model", "hardware"))
    assert q.model is not None and q.missing_facts() == ("hardware",)


@pytest.mark.parametrize(
    ("over", "field", "problem"),
    [
        ({"model": "llama3-8bb"}, "pools.0.model", "unknown model 'llama3-8bb'; close matches: "),
        ({"hardware": "h100"}, "pools.0.hardware", "unknown accelerator 'h100'; close matches: "),
        ({"hardware": {"name": "tpu", "peak_flops": 1e12}}, "pools.0.hardware",
         "or give both peak_flops and mem_bandwidth"),
        ({"model": {"name": "my-model", "layers": 2}}, "pools.0.model",
         "unknown model 'my-model'"),
        ({"model": {"name": "llama-3-8b", "layers": 0}}, "pools.0.model.layers",
         "greater than 0"),
        ({"model": {"name": "llama-3-8b", "colour": 1}}, "pools.0.model.colour",
         "Extra inputs are not permitted"),
    ],
)
def test_bad_facts_by_name_name_the_field_and_problem(over: dict[str, Any], field: str,
                                                       problem: str) -> None:
    with pytest.raises(FleetConfigError) as info:
        parse_fleet({"pools": [pool(**over)]}, source="fleet.yaml")
    assert f"  {field}: " in str(info.value) and problem in str(info.value), str(info.value)


def test_the_host_link_is_a_hardware_fact_with_a_pcie_default() -> None:
    default = parse_fleet({"pools": [pool()]}).pools[0].hardware
    assert default is not None and default.host_link_bandwidth == 25e9
    named = parse_fleet({"pools": [pool(hardware={"name": "h100-sxm",
                                                  "host_link_bandwidth": 50e9})]}).pools[0]
    assert named.hardware is not None and named.hardware.host_link_bandwidth == 50e9
