"""The live page in a real browser: Debian's chromium, headless, driven by Playwright, in front
of a real ``ridge demo`` (the gateway and a simulated fleet of a vLLM and an SGLang pool).

The page loads with no console error, draws every pool and endpoint, and its figures change
under traffic: the requests answered reach the number sent, and the route decisions appear.
A screenshot is written (``RIDGE_TEST_SCREENSHOTS``: a folder to copy it to). Waits are
bounded by generous deadlines on what the page shows, never on how fast it got there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.harness import free_ports
from tests.real_engine.servers import Server, ridge_binary, spawn

playwright = pytest.importorskip("playwright.sync_api")

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
MODEL = "smollm2-135m"
REQUESTS = 12
WAIT_S = 90.0  # a generous bound on the page or the demo reaching a state, on a loaded host

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium "
                                 "(make deps installs it)")]


def _fleet(ports: list[int]) -> dict[str, Any]:
    facts = {"params": 8.03e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8,
             "head_dim": 128, "dtype_bytes": 2, "max_context": 8192}
    hardware = {"name": "l4", "peak_flops": 121e12, "mem_bandwidth": 300e9}
    pools = [("general", "vllm", {"prefix_caching": True}), ("radix", "sglang", {})]
    return {"pools": [{"name": name, "engine": engine, "models": [MODEL],
                       "endpoints": [f"http://127.0.0.1:{port}"], "levers": levers,
                       "model": facts, "hardware": hardware}
                      for (name, engine, levers), port in zip(pools, ports, strict=True)]}


def _gateway_url(demo: Server) -> str:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = re.search(r"pools behind (http://\S+)", demo.log_path.read_text())
        if found:
            return found.group(1)
        assert demo.alive(), demo.log_tail()
        time.sleep(0.2)
    raise AssertionError(f"no demo banner in {WAIT_S:.0f} s:\n{demo.log_tail()}")


def _chat(url: str, i: int) -> int:
    body = json.dumps({"model": MODEL, "max_tokens": 8, "stream": True, "messages": [
        {"role": "user", "content": f"Question {i}: what is a prefix cache?"}]}).encode()
    request = urllib.request.Request(url + "/v1/chat/completions", body,
                                     {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=WAIT_S) as reply:
        reply.read()
        return int(reply.status)


@pytest.fixture
def demo(tmp_path: Path) -> Any:
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(yaml.safe_dump(_fleet(free_ports(2))))
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("RIDGE_")}
    server = spawn("demo", [str(ridge_binary()), "demo", "--config", str(fleet_file),
                            "--port", "0", "--speed", "20"], {**env, "RIDGE_DRAIN_S": "0"},
                   tmp_path, url="")
    try:
        yield _gateway_url(server)
    finally:
        server.signal_group(signal.SIGTERM)
        server.stop()


def _text(page: Any, selector: str) -> str:
    return str(page.locator(selector).inner_text())


def test_the_page_loads_clean_and_its_figures_follow_the_traffic(demo: str,
                                                                  tmp_path: Path) -> None:
    problems: list[str] = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(demo + "/dashboard")
            expect = playwright.expect  # waits on the page itself (its policy forbids eval)
            expect(page.locator("#updated")).to_contain_text("updated", timeout=WAIT_S * 1000)
            assert _text(page, "#requests-total") == "0"
            assert page.locator("#pools tbody tr").count() == 2
            assert page.locator("#endpoints tbody tr").count() == 2
            assert "no requests routed yet" in _text(page, "#decisions")

            with ThreadPoolExecutor(4) as pool:
                assert list(pool.map(lambda i: _chat(demo, i), range(REQUESTS))) == \
                    [200] * REQUESTS
            expect(page.locator("#requests-total")).to_have_text(str(REQUESTS),
                                                                 timeout=WAIT_S * 1000)
            decisions = _text(page, "#decisions")
            assert "no requests routed yet" not in decisions
            assert "general" in decisions or "radix" in decisions
            assert "vllm" in _text(page, "#pools") and "sglang" in _text(page, "#pools")
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert problems == []
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    if target := os.environ.get("RIDGE_TEST_SCREENSHOTS"):
        shutil.copy(shot, Path(target) / shot.name)
