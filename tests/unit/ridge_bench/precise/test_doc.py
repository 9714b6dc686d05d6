"""The precise-routing page's generated block, from a results payload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ridge_bench.precise.doc import BEGIN, END, endpoint_rate, markdown, row, write_doc

URLS = ["http://127.0.0.1:1", "http://127.0.0.1:2"]


def result(label: str, hits: tuple[float, float], **extra: Any) -> dict[str, Any]:
    endpoints = {u: {"queries_tokens": 1000.0, "hits_tokens": h, "requests": 10.0}
                 for u, h in zip(URLS, hits, strict=True)}
    return {"key": label, "label": label, **extra,
            "summary": {"ok": 19, "requests": 20, "errors": {"HTTP 503": 1},
                        "ttft_p50_s": 0.4567, "ttft_p99_s": 3.21},
            "engine_prefix_cache": {"hit_rate": sum(hits) / 2000, "endpoints": endpoints}}


def payload() -> dict[str, Any]:
    meta = {"date": "D", "command": "python -m ridge_bench.precise", "vllm": "0.32.0",
            "kv_blocks": 24, "block_tokens": 128, "rate_rps": 0.4, "duration_s": 180.0,
            "requests": 72, "seed": 0, "f_theory": 0.8, "ridge": "abc", "vllm_router": "0.1.17",
            "machine": "2 cores", "endpoints": URLS}
    return {"meta": meta, "results": [
        result("ridge", (800.0, 600.0), ridge={"kv_events_applied": 50.0,
                                               "prefix_predicted_tokens": 1200.0,
                                               "prefix_lost_tokens": 0.0}),
        result("kv", (700.0, 0.0), kv_decisions={"prefix_cost": 19, "missing_tokens": 1}),
        {"key": "x", "label": "broken", "error": "no render endpoint\nlog tail"}]}


def test_a_row_per_router_with_each_engines_hit_rate() -> None:
    cells = row(payload()["results"][0], URLS)
    assert cells == ["ridge", "19 / 20", "1 HTTP 503", "0.800", "0.600", "0.700", "10 / 10",
                     "0.46", "3.21"]
    assert row(payload()["results"][2], URLS)[:3] == ["broken", "could not run: no render "
                                                      "endpoint", "–"]


def test_an_engine_without_queries_has_no_rate() -> None:
    assert endpoint_rate({"queries_tokens": 0.0, "hits_tokens": 0.0}) is None
    assert endpoint_rate(None) is None


def test_the_block_names_the_routers_own_figures_and_the_run() -> None:
    text = markdown(payload())
    assert "ridge: 50 KV events applied; 1200 prompt tokens predicted" in text
    assert "kv: decisions by outcome: 1 missing_tokens, 19 prefix_cost" in text
    assert "24 KV blocks of 128 tokens each (3,072 tokens)" in text
    assert text.count("\n| ") == 4  # the header's separator and three rows


def test_the_doc_keeps_its_prose(tmp_path: Path) -> None:
    doc = tmp_path / "precise.md"
    doc.write_text(f"# Title\n\nprose\n\n{BEGIN}\nold\n{END}\n\nafter\n")
    write_doc(doc, payload())
    text = doc.read_text()
    assert text.startswith("# Title\n\nprose\n\n") and text.endswith(f"{END}\n\nafter\n")
    assert "old" not in text
