"""A pool's levers: the capacity levers and their names."""

from __future__ import annotations

from typing import Any

import pytest

from config.fleet import FleetConfigError, parse_fleet
from config.levers import KV_CACHE_DTYPE_BYTES
from config.pools import pool_levers
from routing.snapshots import FP8_KV_CACHE, HOST_KV_CACHE, LEVERS, PREFIX_CACHE
from tests.unit.config.fleets import pool


def test_capacity_levers_and_their_names() -> None:
    levers = {"prefix_caching": True, "kv_cache_dtype": "fp8_e5m2",
              "host_kv_cache": {"size_gb": 64}}
    vllm, sglang = parse_fleet({"pools": [
        pool(levers=levers),
        pool(name="s", engine="sglang", endpoints=["http://h:2"], levers=levers)]}).pools
    assert vllm.levers.kv_dtype_bytes == 1.0 and vllm.levers.host_kv_cache is not None
    assert vllm.levers.host_kv_cache.size_bytes == 64e9
    assert (vllm.host_kv_mechanism(), sglang.host_kv_mechanism()) == ("native", "hicache")
    assert pool_levers(vllm) == {PREFIX_CACHE, FP8_KV_CACHE, HOST_KV_CACHE} <= LEVERS
    plain = parse_fleet({"pools": [pool()]}).pools[0]
    assert plain.levers.kv_cache_dtype == "auto" and plain.levers.kv_dtype_bytes is None
    assert plain.host_kv_mechanism() is None and not pool_levers(plain) & {FP8_KV_CACHE}
    assert {KV_CACHE_DTYPE_BYTES[d] for d in ("fp8", "fp8_e4m3", "fp8_e5m2")} == {1.0}


@pytest.mark.parametrize(("over", "problem"), [
    ({"levers": {"kv_cache_dtype": "fp8_inc"}},
     "pools.0.levers.kv_cache_dtype: Input should be 'auto', 'fp8', 'fp8_e4m3' or 'fp8_e5m2'"),
    ({"levers": {"host_kv_cache": {"size_gb": 8}}}, "it needs prefix_caching: true"),
    ({"levers": {"prefix_caching": True, "host_kv_cache": {"size_gb": 0}}},
     "pools.0.levers.host_kv_cache.size_gb: Input should be greater than 0"),
    ({"levers": {"prefix_caching": True, "host_kv_cache": {"size_gb": 8, "mechanism": "hicache"}}},
     "mechanism 'hicache' is not vllm's: it offers native, lmcache"),
    ({"engine": "sglang", "levers": {"prefix_caching": True,
                                     "host_kv_cache": {"size_gb": 8, "mechanism": "lmcache"}}},
     "mechanism 'lmcache' is not sglang's: it offers hicache"),
    ({"engine": "sglang", "levers": {"prefix_caching": True, "host_kv_cache": {"size_gb": 7.5}}},
     "SGLang's --hicache-size takes whole GB"),
    ({"levers": {"prefix_caching": True, "host_kv_cache": {"size": 8}}},
     "pools.0.levers.host_kv_cache.size: Extra inputs are not permitted"),
])
def test_bad_capacity_levers_name_the_problem(over: dict[str, Any], problem: str) -> None:
    with pytest.raises(FleetConfigError) as exc:
        parse_fleet({"pools": [pool(**over)]})
    assert problem in str(exc.value)
