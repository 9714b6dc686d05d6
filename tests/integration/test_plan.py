"""``ridge plan`` end to end: a candidate replayed through ridge's own gateway on virtual time
(:mod:`gateway.plan.evaluate`), and the command from trace to a fleet file that ``ridge serve``
and ``ridge render`` take."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from config.fleet import load_fleet, parse_fleet
from gateway.cli.main import main
from gateway.plan.evaluate import Evaluation, evaluate
from gateway.plan.space import Brief, Part, candidate, fleet_document
from gateway.plan.trace import TraceEntry, load_trace
from gateway.settings import Settings
from tests.fakes.harness import closed_port_url, quick_settings, running_ridge

TRACES = Path(__file__).resolve().parents[2] / "bench" / "ridge_bench" / "traces"
TRACE = TRACES / "conversations.jsonl"
BRIEF = Brief("llama-3-8b", "nvidia-l4", ttft_s=1.0, tpot_s=0.08)
SETTINGS = Settings(auth="off", log_level="warning")


def _entries(n: int) -> list[TraceEntry]:
    return load_trace(TRACE)[:n]


def test_a_replay_is_deterministic_and_coalescing_changes_no_request() -> None:
    fleet = parse_fleet(fleet_document(candidate(Part("general", 1), Part("chunk-512", 1)),
                                       BRIEF))
    entries = _entries(40)
    a = evaluate(fleet, entries, settings=SETTINGS, seed=3)
    assert evaluate(fleet, entries, settings=SETTINGS, seed=3) == a
    every = evaluate(fleet, entries, settings=SETTINGS, seed=3, every_step=True)
    assert [(s.pool, s.status, s.ttft_s, s.tpot_s) for s in every.served] == \
        [(s.pool, s.status, s.ttft_s, s.tpot_s) for s in a.served]
    assert {s.pool for s in a.served} == {"general", "chunk-512"}
    assert all(s.status == 200 and s.ttft_s is not None for s in a.served)
    assert a.pools["general"].queried_tokens > 0 and a.span_s >= a.window_s > 0


def test_load_scaled_up_is_served_worse() -> None:
    fleet = parse_fleet(fleet_document(candidate(Part("general", 1)), BRIEF))
    entries = _entries(60)
    calm = evaluate(fleet, entries, settings=SETTINGS)
    busy = evaluate(fleet, entries, settings=SETTINGS, scale=8.0)
    assert busy.window_s == pytest.approx(calm.window_s / 8.0)

    def mean_ttft(ev: Evaluation) -> float:
        ttfts = [s.ttft_s for s in ev.served if s.ttft_s is not None]
        return sum(ttfts) / len(ttfts)

    assert mean_ttft(busy) > mean_ttft(calm)


def test_ridge_plan_writes_a_fleet_file_serve_and_render_take(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(TRACE.read_text().splitlines(keepends=True)[:30]))
    out = tmp_path / "fleet.yaml"
    status = main(["plan", "--trace", str(trace), "--gpus", "2", "--accelerator", "nvidia-l4",
                   "--model", "llama-3-8b", "--recipes", "general,chunk-512", "--jobs", "1",
                   "--rounds", "1", "--slo", "ttft=1,tpot=0.08", "--out", str(out),
                   "--compare", "1", "--compare-scales", "1"])
    printed = capsys.readouterr()
    assert status == 0, printed.err
    assert "goodput/s" in printed.out and "best: " in printed.out
    assert "uniform 1/2" in printed.err and "mixes" in printed.err
    assert "fewest GPUs on which 99% of requests meet the SLO" in printed.out
    assert "one general pool, round robin" in printed.out
    for plot in ("fleet-cost-ttft.png", "fleet-goodput-gpus.png"):
        assert (tmp_path / plot).read_bytes()[:4] == b"\x89PNG"
    text = out.read_text()
    assert text.startswith("# Planned by `ridge plan` from t.jsonl (30 requests")
    fleet = load_fleet(out)
    assert sum(len(p.endpoints) for p in fleet.pools) == 2
    assert fleet.plan is not None and fleet.plan.source == "t.jsonl"
    assert sum(p.share for p in fleet.plan.pools.values()) == pytest.approx(1.0, abs=1e-3)
    assert main(["render", "k8s", str(out), "-o", str(tmp_path / "k8s")]) == 0
    assert (tmp_path / "k8s" / "kustomization.yaml").is_file()


async def test_a_gateway_serving_a_planned_fleet_exports_its_drift(tmp_path: Path) -> None:
    """The plan the gateway compares with is the fleet file's (after a reload, the new one)."""
    doc = fleet_document(candidate(Part("general", 1)), BRIEF)
    doc["pools"][0]["endpoints"] = [closed_port_url()]
    planned = parse_fleet({**doc, "plan": {"source": "t.jsonl",
                                           "pools": {"general": {"share": 1.0}}}})
    for fleet, exported in ((planned, True), (parse_fleet(doc), False)):
        async with running_ridge(fleet, quick_settings(auth="off")) as ridge, \
                aiohttp.ClientSession() as session, session.get(ridge.url + "/metrics") as reply:
            page = await reply.text()
        assert ("# TYPE ridge_plan_share_drift gauge" in page) is exported
