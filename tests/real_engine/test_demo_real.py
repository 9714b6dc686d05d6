"""``ridge demo --real``: the demo fleet on real vLLM engines, as a user starts it.

Runs before the tier's shared engines start (this file sorts first and asks for none of
them), so at most two engines are up at a time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.real_engine.prompts import CAPITAL_ANSWER, CAPITAL_QUESTION, user
from tests.real_engine.scrape import poll, totals
from tests.real_engine.servers import free_port

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 300.0
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
STOP_TIMEOUT_S = 40.0


def _followed(totals: dict[str, float]) -> bool:
    """ridge has taken a replay or a batch of KV-cache events from an engine."""
    return (totals.get("ridge_kv_events_replays_total", 0)
            + totals.get("ridge_kv_events_batches_total", 0)) > 0


def _fleet_on_free_ports(tmp_path: Path) -> tuple[Path, list[int]]:
    raw = yaml.safe_load((ROOT / "gateway" / "demo" / "demo-real-fleet.yaml").read_text())
    ports = []
    for pool in raw["pools"]:
        port = free_port()
        pool["endpoints"] = [f"http://127.0.0.1:{port}"]
        ports.append(port)
        if "kv_events" in pool:
            pool["kv_events"] = {"port": free_port(), "replay_port": free_port()}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, ports


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"ridge demo --real exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail(f"ridge demo --real not ready in {READY_TIMEOUT_S:.0f} s: "
                f"{log.read_text()[-3000:]}")


def test_demo_real_serves_and_stops_its_engines(tmp_path: Path) -> None:
    fleet, engine_ports = _fleet_on_free_ports(tmp_path)
    port, log = free_port(), tmp_path / "demo.log"
    ridge = str(Path(sys.executable).with_name("ridge"))
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [ridge, "demo", "--real", "--config", str(fleet), "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, url, log)
        reply = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "model": "smollm2-135m", "messages": user(CAPITAL_QUESTION), "max_tokens": 32,
            "temperature": 0})
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == CAPITAL_ANSWER
        assert "lever=" in reply.headers["x-ridge-route"]
        events = poll(lambda: totals(url), _followed, timeout_s=120)
        assert _followed(events)  # it follows the plain engine's KV events
        assert events.get("ridge_kv_events_resets_total", 0) == 0
        tools = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "model": "smollm2-135m", "messages": user("What is the weather in Paris?"),
            "max_tokens": 32, "temperature": 0, "tool_choice": "auto", "tools": [WEATHER]})
        assert tools.status_code == 200, tools.text  # the engines run with tool calling on
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(STOP_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for engine_port in engine_ports:  # the engines went with it
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{engine_port}/health", timeout=2)
