"""The comparison's gateways (nothing started): each peer's command over the rendered fleet,
the --extra-router forms, the memory figures each cell reads, and the plots drawn from the
saved cells."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from gateway.settings import Settings
from ridge_bench.compare import benchmark as compare
from ridge_bench.compare import doc as compare_doc
from ridge_bench.harness import fleets, gateways
from ridge_bench.harness.gateways import Launch, command

METRICS = """# HELP ridge_prefix_index_bytes their memory [B]
# TYPE ridge_prefix_index_bytes gauge
ridge_prefix_index_bytes 4096.0
# HELP ridge_kv_event_index_bytes their memory [B]
# TYPE ridge_kv_event_index_bytes gauge
ridge_kv_event_index_bytes{pool="a"} 100.0
ridge_kv_event_index_bytes{pool="b"} 28.0
# HELP ridge_prefix_index_entries entries
# TYPE ridge_prefix_index_entries gauge
ridge_prefix_index_entries 64.0
"""


@pytest.mark.parametrize("name", ["sglang_ca", "sglang_rr", "smg_ca", "vllm_ca"])
def test_each_peer_fronts_every_endpoint_of_the_rendered_fleet(name: str, tmp_path: Path
                                                               ) -> None:
    router = fleets.ROUTERS[name]
    fleet = fleets.render(router, tmp_path / "fleet.yaml", itertools.count(41000).__next__)
    urls = [u for p in fleet.pools for u in p.endpoint_urls()]
    assert router.peer is not None and len(urls) == 8
    kind, policy = router.peer
    python = tmp_path / "python"
    gateway = gateways.peer(kind, policy)
    assert (gateway.key, gateway.kind) == (kind, kind)  # its CPU entry and log: the kind's
    assert gateway.key in compare_doc.GATEWAY_CPU_KEYS
    argv, env, cwd = command(gateway, Launch().with_python(kind, python), 7001, urls, tmp_path)
    assert argv[:3] == [str(python), "-m", gateways.ROUTERS[kind].module]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--port") + 1] == "7001"
    assert argv[argv.index("--policy") + 1] == policy
    start = argv.index("--worker-urls") + 1
    assert argv[start:start + len(urls)] == urls
    assert argv[start + len(urls)].startswith("--")
    assert env == {"PYTHONPATH": ""} and cwd == tmp_path


def test_extra_routers_join_the_matrix_with_their_gateway() -> None:
    fleet = fleets.HOMOGENEOUS
    args = compare.parser().parse_args([
        "--routers", "round_robin,smg_ca", "--extra-router", f"sg={fleet}@sglang:cache_aware",
        "--extra-router", f"mine={fleets.LEVERS}"])
    matrix = compare.matrix_of(args)
    assert list(matrix.routers) == ["round_robin", "smg_ca", "sg", "mine"]
    assert matrix.routers["sg"].peer == ("sglang", "cache_aware")
    assert matrix.routers["smg_ca"].peer == ("smg", "cache_aware")
    assert matrix.routers["sg"].fleet == fleet
    assert matrix.routers["mine"].gateway == fleets.RIDGE
    bad = compare.parser().parse_args(["--extra-router", f"x={fleet}@sglang:manual"])
    with pytest.raises(SystemExit, match="--extra-router"):
        compare.matrix_of(bad)


def test_peak_rss_of_this_process() -> None:
    if not Path("/proc/self/status").exists():
        pytest.skip("no /proc")
    status = Path(f"/proc/{os.getpid()}/status").read_text()
    (line,) = [x for x in status.splitlines() if x.startswith("VmRSS:")]
    rss_mb = int(line.split()[1]) / 1024
    peak = compare.peak_rss_mb(os.getpid())
    assert peak is not None and peak >= rss_mb > 1.0


def test_peak_rss_of_no_process_is_unknown() -> None:
    assert compare.peak_rss_mb(2**31 - 1) is None


def test_ridge_index_gauges_are_summed_over_labels() -> None:
    gauges = compare_doc.INDEX_GAUGES
    assert compare.sample_sums(METRICS, gauges) == {"ridge_prefix_index_bytes": 4096.0,
                                                    "ridge_kv_event_index_bytes": 128.0}
    assert compare.sample_sums("", gauges) == {}


def test_peer_cells_name_the_fleets_model_and_ridge_cells_ask_ridge(tmp_path: Path) -> None:
    ports = itertools.count(42000).__next__
    ridge = fleets.render(fleets.ROUTERS["cache_aware"], tmp_path / "b.yaml", ports)
    for name in ("sglang_rr", "vllm_ca"):
        peer = fleets.render(fleets.ROUTERS[name], tmp_path / f"{name}.yaml", ports)
        assert compare.cell_model(fleets.ROUTERS[name], peer) == "llama-3-8b"
    assert compare.cell_model(fleets.ROUTERS["cache_aware"], ridge) is None


def test_ridge_time_settings_follow_the_simulators_speed() -> None:
    assert compare.ridge_time_env(1.0) == {}
    env = compare.ridge_time_env(4.0)
    assert set(env) == set(compare.TIME_SETTINGS)
    assert float(env["RIDGE_REGISTRY__POLL_INTERVAL_S"]) == 0.25  # 1 s ÷ 4
    assert float(env["RIDGE_STATE__PREFIX_MAX_AGE_S"]) == 150.0  # 600 s ÷ 4
    settings = Settings.model_validate({})  # the variables name real settings
    for var in env:
        section, name = var.removeprefix("RIDGE_").lower().split("__")
        assert hasattr(getattr(settings, section), name), var


def test_kv_events_without_a_tokenizer_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        compare.parse_args(["--kv-events"])
    assert exc.value.code == 2
    assert "--kv-events needs --tokenizer" in capsys.readouterr().err


def test_the_tokenizer_folder_must_hold_a_tokenizer(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        compare.parse_args(["--tokenizer", str(tmp_path)])
    assert "no tokenizer.json" in capsys.readouterr().err


def test_the_switches_reach_every_cell_fleet_and_the_results_meta(tmp_path: Path) -> None:
    folder = tmp_path / "smol"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    args = compare.parse_args(["--tokenizer", str(folder), "--kv-events"])
    matrix = compare.matrix_of(args)
    assert matrix.extras == fleets.Extras(folder.resolve(), kv_events=True)
    meta = matrix.meta()
    assert (meta["tokenizer"], meta["kv_events"]) == ("smol", True)
    plain = compare.matrix_of(compare.parse_args([])).meta()
    assert (plain["tokenizer"], plain["kv_events"]) == (None, False)


def test_the_kv_events_ridge_applied_are_summed_over_endpoints() -> None:
    counters = METRICS + """# HELP ridge_kv_events_total events applied
# TYPE ridge_kv_events_total counter
ridge_kv_events_total{pool="a",endpoint="0"} 7.0
ridge_kv_events_total{pool="a",endpoint="1"} 5.0
"""
    figures = compare.ridge_figures(counters)
    assert figures["kv_events_applied"] == 12.0
    assert figures["ridge_prefix_index_bytes"] == 4096.0
    assert compare.ridge_figures(METRICS)["kv_events_applied"] is None


def test_predicted_and_lost_prefix_tokens_are_summed_over_pools() -> None:
    counters = METRICS + """# HELP ridge_prefix_predicted_tokens predicted
# TYPE ridge_prefix_predicted_tokens counter
ridge_prefix_predicted_tokens_total{pool="a"} 300.0
ridge_prefix_predicted_tokens_total{pool="b"} 100.0
# HELP ridge_prefix_lost_tokens lost
# TYPE ridge_prefix_lost_tokens counter
ridge_prefix_lost_tokens_total{pool="a"} 40.0
"""
    figures = compare.ridge_figures(counters)
    assert (figures["prefix_predicted_tokens"], figures["prefix_lost_tokens"]) == (400.0, 40.0)
    assert compare.ridge_figures(METRICS)["prefix_lost_tokens"] is None


def _cell(workload: str, router: str, goodput: float) -> dict[str, object]:
    return {"workload": workload, "router": router, "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
            "summary": {"goodput_rps": goodput},
            "pools": {"general": {"goodput_rps": goodput, "throughput_rps": goodput + 1}},
            "engine_prefix_cache": {"hit_rate": 0.5, "endpoints": {
                "http://127.0.0.1:1": {"queries_tokens": 10, "hits_tokens": 5,
                                       "pool": "general"}}},
            "requests_file": f"{workload}-{router}/requests.jsonl"}


def _records(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"sent_s": i * 0.2, "pool": "general", "error": None,
                                        "ttft_s": 0.1 + i * 0.01, "tpot_s": 0.05}) + "\n"
                            for i in range(20)))


def test_the_plots_come_from_the_saved_cells_and_their_records(tmp_path: Path) -> None:
    cells = [_cell("agent", "ridge", 13.5), _cell("agent", "round_robin", 7.0)]
    _records(tmp_path / "agent-ridge" / "requests.jsonl")  # round_robin's records are gone
    drawn = {p.name for p in compare.draw_plots(cells, tmp_path, tmp_path / "plots")}
    assert "router-goodput.png" in drawn
    assert {"router-agent-ridge-ttft-time.png", "router-agent-ridge-refusals-time.png",
            "router-agent-ridge-hit-rate-replicas.png"} <= drawn
    assert {n for n in drawn if "round_robin" in n} == {
        "router-agent-round_robin-goodput-pools.png",
        "router-agent-round_robin-hit-rate-replicas.png"}


def test_from_results_draws_the_plots_beside_the_results(tmp_path: Path) -> None:
    meta = {"rates": {"agent": 16.0}, "durations_s": {"agent": 60.0}}
    cell = _cell("agent", "ridge", 13.5)
    del cell["requests_file"]  # saved before the key: the cell folder's records
    (tmp_path / "results.json").write_text(json.dumps({"meta": meta, "cells": [cell]}))
    _records(tmp_path / "agent-ridge" / "requests.jsonl")
    assert compare.main(["--from-results", str(tmp_path / "results.json")]) == 0
    assert (tmp_path / "plots" / "router-agent-ridge-ttft-cdf.png").is_file()
    assert compare.main(["--from-results", str(tmp_path / "results.json"), "--plots",
                         str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "router-goodput.png").is_file()
