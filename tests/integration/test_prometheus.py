"""A real Prometheus scraping ridge and its simulated fleet under a short load.

Every panel query of every Grafana dashboard and every recording rule must return data
through Prometheus' HTTP API; the rule files must pass ``promtool`` and load without
evaluation errors; the backend-down and SLO-burn alerts must go pending; and ridge's own FLOP
and byte estimates must agree with the simulated engines' counters within 10 %.

Prometheus is Debian's ``prometheus`` package (``bash deploy/apt-install.sh prometheus``;
``make test`` installs it). It runs on 127.0.0.1 with a temporary config and data directory,
scraping and evaluating every second, and is always stopped.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import re
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from backends.sim import RunningFleet, start_fleet
from config.fleet import Fleet, parse_fleet
from tests.fakes.harness import RunningRidge, free_ports, quick_settings, running_ridge

REPO = Path(__file__).resolve().parents[2]
PROM_DIR = REPO / "deploy" / "prometheus"
RULE_FILES = (PROM_DIR / "rules" / "ridge.rules.yml", PROM_DIR / "rules" / "ridge.alerts.yml")
DASHBOARDS = sorted((REPO / "grafana" / "dashboards").glob("*.json"))

# A Llama-3.2-1B-shaped model on L4s: ≈10 ms per decode step, so a request takes 0.1-1 s.
FACTS = {"params": 1.24e9, "layers": 16, "hidden_size": 2048, "kv_heads": 8, "head_dim": 64,
         "dtype_bytes": 2, "max_context": 8192}
L4 = {"name": "l4", "peak_flops": 121e12, "mem_bandwidth": 300e9}
SLOS = {"m": {"ttft_s": 0.03, "tpot_s": 0.012, "e2e_s": 0.5,
              "classes": [{"name": "long", "min_max_tokens": 48, "e2e_s": 1.0}]},
        "m2": {"e2e_s": 5.0}}
# Grafana's template variables, as concrete values
VARIABLES = {"$__rate_interval": "1m", "${model}": ".*", "$model": ".*", "${pool}": ".*",
             "$pool": ".*"}
BOUND_S = 20.0  # the longest any single wait may take


def _pool(name: str, engine: str, ports: list[int], models: list[str], **extra: Any
          ) -> dict[str, Any]:
    return {"name": name, "engine": engine, "models": models, "model": FACTS, "hardware": L4,
            "endpoints": [f"http://127.0.0.1:{p}" for p in ports], **extra}


def build_fleet() -> Fleet:
    p = free_ports(4)
    return parse_fleet({
        "pools": [
            _pool("general", "vllm", p[0:1], ["m"], levers={"prefix_caching": True},
                  engine_args=["--enable-prompt-tokens-details"]),  # usage's cached tokens
            _pool("radix", "sglang", p[1:2], ["m"], levers={"prefix_caching": True},
                  engine_args=["--enable-cache-report"]),
            _pool("edge", "vllm", p[2:4], ["m2"]),
        ],
        "slos": SLOS,
    })


# -- Prometheus, started and always stopped ------------------------------------------------------


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    async def query(self, session: aiohttp.ClientSession, expr: str) -> list[dict[str, Any]]:
        async with session.get(self.url + "/api/v1/query", params={"query": expr}) as r:
            body = await r.json()
        assert body.get("status") == "success", f"{expr}: {body}"
        result: list[dict[str, Any]] = body["data"]["result"]
        return result


def prometheus_config(ridge: RunningRidge, fleet: Fleet, sim: RunningFleet) -> dict[str, Any]:
    """The shipped prometheus.yml, pointed at this test's ridge and engines, every second."""
    config: dict[str, Any] = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s", scrape_timeout="1s")
    config["rule_files"] = [str(path) for path in RULE_FILES]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    jobs["ridge"]["static_configs"] = [{"targets": [ridge.url.removeprefix("http://")]}]
    by_url = {s.configured_url: s.url for s in sim.servers}
    jobs["ridge-engines"]["static_configs"] = [
        {"targets": [by_url[u].removeprefix("http://") for u in pool.endpoint_urls()],
         "labels": {"pool": pool.name}}
        for pool in fleet.pools
    ]
    return config


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: bash deploy/apt-install.sh prometheus")
    return path


async def start_prometheus(config: dict[str, Any], workdir: Path) -> Prometheus:
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    check = subprocess.run([_tool("promtool"), "check", "config", str(config_path)],
                           capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    (port,) = free_ports(1)
    log = workdir / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [_tool("prometheus"), f"--config.file={config_path}",
             f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--log.level=warn"],
            stdout=out, stderr=subprocess.STDOUT,
        )
    prom = Prometheus(f"http://127.0.0.1:{port}", process, log)
    try:
        await _until(lambda s: _ready(s, prom), "Prometheus ready")
    except BaseException:
        stop_prometheus(prom)
        raise
    return prom


def stop_prometheus(prom: Prometheus) -> None:
    prom.process.terminate()
    try:
        prom.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        prom.process.kill()
        prom.process.wait(timeout=10)


async def _ready(session: aiohttp.ClientSession, prom: Prometheus) -> bool:
    if prom.process.poll() is not None:
        raise AssertionError(f"prometheus exited: {prom.log.read_text()[-2000:]}")
    try:
        async with session.get(prom.url + "/-/ready") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def _until(check: Any, what: str, timeout: float = BOUND_S) -> None:
    """Poll ``check(session)`` every 0.2 s until it is true, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if await check(session):
                return
            await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Stack:
    fleet: Fleet
    sim: RunningFleet
    ridge: RunningRidge
    prometheus: Prometheus


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    fleet = build_fleet()
    sim = await start_fleet(fleet, speed=1.0, seed=3)
    try:
        settings = quick_settings(registry={"poll_interval_s": 0.5})
        async with running_ridge(fleet, settings) as ridge:
            prom = await start_prometheus(prometheus_config(ridge, fleet, sim), tmp_path)
            try:
                yield Stack(fleet, sim, ridge, prom)
            finally:
                stop_prometheus(prom)
    finally:
        await sim.stop()


# -- the load ----------------------------------------------------------------------------------


async def _status(r: aiohttp.ClientResponse) -> int:
    """The answer's status. A 503 must be admission control's refusal: on a slow host the
    engine-side TTFT nears model m's 30 ms objective, and a request that cannot wait for a
    slot within it is refused (``overloaded``); any other 503 fails the test."""
    body = await r.read()
    if r.status == 503:
        assert json.loads(body)["error"]["code"] == "overloaded", body
    return r.status


async def _chat(session: aiohttp.ClientSession, ridge: RunningRidge, model: str, i: int,
                stream: bool, max_tokens: int, words: int) -> int:
    prompt = " ".join(f"w{i}x{j}" for j in range(words))
    body = {"model": model, "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": f"Request {i}: {prompt}"}]}
    async with session.post(ridge.url + "/v1/chat/completions", json=body) as r:
        return await _status(r)


async def _shared(session: aiohttp.ClientSession, ridge: RunningRidge, k: int) -> int:
    """A question under a long system prompt every such request shares (prefix reuse)."""
    system = " ".join(f"Rule {j}: keep to the topic." for j in range(80))
    body = {"model": "m", "max_tokens": 8, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": f"Question {k}?"}]}
    async with session.post(ridge.url + "/v1/chat/completions", json=body) as r:
        return await _status(r)


async def drive_load(stack: Stack) -> list[int]:
    """≈40 requests to model m (streamed and not, short and long, some over their SLO, two
    answered 500 by the engine — a 503 would be retried elsewhere — and on a slow host some
    refused by admission control), four sharing a prefix, then model m2 with one of its two
    endpoints shut."""
    general = stack.sim.server(stack.fleet.pool("general").endpoint_urls()[0])
    general.endpoint.faults.set("error", 500, count=2)
    timeout = aiohttp.ClientTimeout(total=BOUND_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def worker(w: int) -> list[int]:
            return [await _chat(session, stack.ridge, "m", 10 * w + k, stream=k % 3 != 0,
                                max_tokens=(16, 40, 64)[k % 3], words=(20, 300, 1200)[(w + k) % 3])
                    for k in range(7)]
        statuses = [s for batch in await asyncio.gather(*(worker(w) for w in range(6)))
                    for s in batch]
        statuses += [await _shared(session, stack.ridge, k) for k in range(4)]
        edge = stack.sim.server(stack.fleet.pool("edge").endpoint_urls()[0])
        await edge.close()  # refuses connections: ridge retries on the other, then sees it down
        statuses += await asyncio.gather(*(
            _chat(session, stack.ridge, "m2", 100 + k, True, 16, 30) for k in range(4)))
    return statuses


# -- the checks --------------------------------------------------------------------------------


def panel_queries() -> Iterator[tuple[str, str, str]]:
    """(dashboard, panel title, PromQL) of every target of every panel, variables filled."""
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        for panel in _panels(dashboard["panels"]):
            for target in panel["targets"]:
                yield dashboard["title"], panel["title"], substitute(target["expr"])


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield from _panels(panel.get("panels", []))
        if panel.get("type") != "row":
            yield panel


def substitute(expr: str) -> str:
    for name, value in sorted(VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unknown template variable in {expr}"
    return expr


def _rules(path: Path) -> list[dict[str, Any]]:
    return [r for group in yaml.safe_load(path.read_text())["groups"] for r in group["rules"]]


def recording_rules() -> list[dict[str, Any]]:
    return [r for r in _rules(RULE_FILES[0]) if "record" in r]


def _has_data(result: list[dict[str, Any]]) -> bool:
    return any(not math.isnan(float(sample["value"][1])) for sample in result)


async def _missing(prom: Prometheus, queries: list[tuple[str, str]]) -> list[str]:
    """The labels of the queries that returned no sample (or only NaN)."""
    async with aiohttp.ClientSession() as session:
        results = [await prom.query(session, expr) for _, expr in queries]
    return [f"{label}: {expr}" for (label, expr), result in zip(queries, results, strict=True)
            if not _has_data(result)]


def _scraped(prom: Prometheus, expr: str) -> Any:
    """A check for :func:`_until`: ``expr`` has data."""
    async def check(session: aiohttp.ClientSession) -> bool:
        return _has_data(await prom.query(session, expr))
    return check


async def test_dashboards_and_rules_show_data_from_a_real_prometheus(stack: Stack) -> None:
    prom = stack.prometheus
    await _until(_scraped(prom, 'up{job="ridge"} == 1'), "the first scrape of ridge")
    statuses = await drive_load(stack)
    by_count = collections.Counter(statuses)
    assert by_count[500] == 2 and by_count[200] + by_count[503] == len(statuses) - 2, by_count
    assert by_count[200] >= len(statuses) // 2, by_count
    # the load's last requests are in ridge's registry; wait for a poll, scrapes and evaluations
    await _until(_scraped(prom, "sum(ridge_upstream_retries_total) > 0"), "a retry scraped")
    await _until(_scraped(prom, 'ALERTS{alertname="RidgeBackendDown"}'), "backend down")
    await asyncio.sleep(3.0)

    panels = [(f"{d} / {p}", e) for d, p, e in panel_queries()]
    assert len(DASHBOARDS) == 4 and len(panels) >= 4 * 6
    assert await _missing(prom, panels) == []

    rules = recording_rules()
    assert len(rules) >= 10
    exprs = [(r["record"] + " (expr)", r["expr"]) for r in rules]
    recorded = [(r["record"], r["record"]) for r in rules]
    assert await _missing(prom, exprs + recorded) == []

    await _rules_loaded_without_errors(prom)
    assert await _missing(prom, [
        ("SLO burn alert", 'ALERTS{alertname="RidgeSloBurnRateHigh",model="m"}'),
        ("engine scrape alert", 'ALERTS{alertname="RidgeEngineScrapeDown",pool="edge"}'),
        ("some goodput", 'ridge_goodput_requests_total{model="m"}'),
        ("some violations", 'ridge_slo_violations_total{model="m",slo="error"}'),
    ]) == []
    await _ridge_estimates_agree_with_the_engines(prom)


def test_rule_files_pass_promtool() -> None:
    result = subprocess.run([_tool("promtool"), "check", "rules", *map(str, RULE_FILES)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    found = [int(n) for n in re.findall(r"SUCCESS: (\d+) rules found", result.stdout)]
    assert found == [len(_rules(path)) for path in RULE_FILES]


async def _rules_loaded_without_errors(prom: Prometheus) -> None:
    async with aiohttp.ClientSession() as session, session.get(prom.url + "/api/v1/rules") as r:
        groups = (await r.json())["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == sum(len(_rules(path)) for path in RULE_FILES)
    bad = [(rule["name"], rule.get("lastError")) for rule in rules if rule["health"] != "ok"]
    assert bad == []


async def _ridge_estimates_agree_with_the_engines(prom: Prometheus) -> None:
    """ridge's FLOPs and bytes per endpoint (from usage tokens and token timings) against the
    simulated vLLM engines' estimated_*_per_gpu_total, as scraped (all requests finished):
    the work counters, and the MFU/MBU gauges over the same window."""
    names = ("estimated_flops_total", "estimated_read_bytes_total",
             "estimated_write_bytes_total", "mfu_ratio", "mbu_ratio")
    async with aiohttp.ClientSession() as session:
        for counter in names:
            result = await prom.query(session, f"ridge_{counter}")
            values = {(s["metric"]["endpoint"], s["metric"]["source"]): float(s["value"][1])
                      for s in result}
            compared = [url for url, source in values if source == "engine"
                        and values.get((url, "ridge"), 0) > 0]
            assert compared, f"no endpoint to compare for {counter}: {values}"
            for url in compared:
                ridge, engine = values[(url, "ridge")], values[(url, "engine")]
                assert ridge == pytest.approx(engine, rel=0.10), (counter, url, ridge, engine)
